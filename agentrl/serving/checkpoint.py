"""`agentrl model init`: build a fresh Llama-architecture checkpoint directory with our tokenizer.

The directory is a standard HF checkpoint (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with the chat template, special tokens, generation_config.json) so it loads
with `transformers.AutoModelForCausalLM` / `AutoTokenizer` and with vLLM. head_dim is 32 or 64
because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agentrl.errors import PolicyError
from agentrl.serving.model import CausalLM, ModelConfig, check_head_dim
from agentrl.serving.tokenizer_build import build_tokenizer
from agentrl.tokenizer import CHAT_TEMPLATE, END_OF_TEXT, IM_END

# name: (hidden, layers, heads, kv_heads, intermediate); parameter counts at vocab 2048.
MODEL_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (128, 4, 4, 2, 384),  # ~1.0M
    "small": (256, 10, 8, 4, 768),  # ~8.4M
    "medium": (512, 8, 8, 2, 1536),  # ~25M
    "large": (640, 10, 10, 2, 1792),  # ~46M
}


def model_config(size: str, vocab_size: int, max_positions: int = 2048) -> ModelConfig:
    if size not in MODEL_SIZES:
        raise PolicyError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    hidden, layers, heads, kv_heads, inter = MODEL_SIZES[size]
    cfg = ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    check_head_dim(cfg)
    return cfg


def init_checkpoint(
    out_dir: str | Path, size: str = "tiny", vocab_size: int = 2048, seed: int = 0, max_positions: int = 2048
) -> Path:
    """Train the tokenizer, initialise a model of `size`, write both to `out_dir`; return it."""
    out = Path(out_dir)
    tokenizer = build_tokenizer(vocab_size, seed=seed)
    tokenizer.model_max_length = max_positions
    # The trained vocabulary can come out smaller than asked (small corpus): size the model to it.
    cfg = model_config(size, len(tokenizer), max_positions)
    im_end, eot = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    cfg.eos_token_id, cfg.pad_token_id = im_end, eot
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    model.init_weights(seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(str(out))
    _portable_tokenizer_config(out)
    generation = {"eos_token_id": [im_end, eot], "pad_token_id": eot, "do_sample": True, "temperature": 1.0}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


def _portable_tokenizer_config(out: Path) -> None:
    """Make tokenizer_config.json readable by transformers 4.x too (vLLM pins its own version).

    transformers 5 writes `tokenizer_class: TokenizersBackend` and the chat template to a separate
    chat_template.jinja; older releases want `PreTrainedTokenizerFast` and the template inline.
    """
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg.pop("backend", None)
    path.write_text(json.dumps(cfg, indent=2) + "\n")
