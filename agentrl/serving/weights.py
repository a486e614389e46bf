"""Reading and checking new weights before an engine uses any of them (all-or-nothing updates).

A weight update arrives as a checkpoint directory or as a safetensors body. Everything that can be
wrong with it (unreadable or corrupt files, a directory where a file should be, missing or extra
names, wrong shapes, non-float dtypes, NaN/inf values) is found here, before the engine touches
its model, so a rejected update leaves the old weights serving. Errors are `InvalidRequest`
(HTTP 400) naming the tensor or file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from agentrl.serving.engine_api import InvalidRequest

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some HF checkpoints carry; recomputed here


def distinct_tensors(
    state_dict: Mapping[str, torch.Tensor], skip: frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """Each storage once (a tied output head aliases the embedding), contiguous and on the CPU,
    as safetensors wants them; names in `skip` are left out too."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        if name in skip or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().contiguous().cpu()
    return tensors


def read_checkpoint_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's *.safetensors files (one file or shards)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(path)
    if not directory.is_dir():
        raise InvalidRequest(f"{path} is not a directory")
    files = sorted(directory.glob("*.safetensors"))
    not_files = [f.name for f in files if not f.is_file()]
    if not_files:
        raise InvalidRequest(f"{path}: {not_files[0]} is not a regular file")
    if not files:
        raise InvalidRequest(f"no *.safetensors file in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise InvalidRequest(f"{f.name} is not a readable safetensors file: {exc}") from exc
    return state


def read_safetensors_bytes(raw: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors payload (an HTTP body)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(raw)
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise InvalidRequest(f"body is not a safetensors file: {exc}") from exc


def check_state_dict(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], optional: frozenset[str]
) -> dict[str, torch.Tensor]:
    """Check `state` against the model's own tensors `expected`; return it without ignored buffers.

    `optional` names may be absent (a tied `lm_head.weight`). Any float dtype is accepted (a bf16
    push into an fp32 model is a plain conversion); integer, bool and complex tensors are refused
    rather than cast.
    """
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
    missing = sorted(set(expected) - set(state) - optional)
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise InvalidRequest(
            f"state dict does not match the model: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise InvalidRequest(f"{name}: not a tensor")
        want = expected[name]
        if tuple(value.shape) != tuple(want.shape):
            raise InvalidRequest(f"{name}: shape {tuple(value.shape)} != model's {tuple(want.shape)}")
        if not value.is_floating_point():
            raise InvalidRequest(f"{name}: dtype {value.dtype} is not a floating-point type")
        if not bool(torch.isfinite(value).all()):
            raise InvalidRequest(f"{name}: contains NaN or infinite values")
    return state
