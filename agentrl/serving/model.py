"""A decoder-only causal LM in plain torch: the Hugging Face Llama architecture, top to bottom.

Parameter names match `transformers.LlamaForCausalLM` (and `Qwen2ForCausalLM`, which is Llama with
a bias on the q/k/v projections), so a checkpoint directory written by `save_pretrained` loads in
`transformers` and vLLM, and any local Llama/Qwen2 checkpoint loads here.

One forward serves both callers:

- the trainer: `model(input_ids)` -> logits [B, T, V], causal attention, no cache. Right-pad a
  batch; causal attention means real tokens never see the padding after them.
- the engine: `model(input_ids, cache=..., start=...)` where `cache` holds per-layer key/value
  tensors [B, n_kv_heads, capacity, head_dim] (views into the engine's slot cache) and `start[b]`
  is how many tokens of row b are already in the cache. The new keys/values are written into the
  cache at positions start[b] .. start[b] + T - 1 and each query attends to every cached position
  up to its own. Rows may be right-padded (shorter rows just ignore their padded outputs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.errors import PolicyError

SAFETENSORS_NAME = "model.safetensors"


@dataclass
class ModelConfig:
    """The subset of a HF Llama/Qwen2 `config.json` this model reads (and writes back)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    qkv_bias: bool = False  # Qwen2 checkpoints have a bias on q/k/v
    o_bias: bool = False  # Llama's `attention_bias` puts a bias on o_proj as well
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        """Read a HF config dict; reject features this model does not implement rather than guess."""
        model_type = raw.get("model_type", "llama")
        if model_type not in ("llama", "qwen2"):
            raise PolicyError(f"model_type {model_type!r} is not supported (llama and qwen2 are)")
        if raw.get("hidden_act", "silu") != "silu":
            raise PolicyError(f"hidden_act {raw['hidden_act']!r} is not supported (only silu)")
        if raw.get("mlp_bias"):
            raise PolicyError("mlp_bias=true is not supported")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise PolicyError(f"rope type {rope_type!r} is not supported (only default RoPE)")
        theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type == "llama" and attention_bias,
            model_type=model_type,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` that `transformers` and vLLM read."""
        arch = "Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"
        out: dict[str, Any] = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "hidden_act": "silu",
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
            "use_cache": True,
        }
        if self.model_type == "llama":
            out["attention_bias"] = self.o_bias
            out["mlp_bias"] = False
        return out


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like HF does, so bf16 weights give the same numbers.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables [B, T, head_dim] for the given absolute positions [B, T] (HF's half-rotation)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by the per-position angles (cos/sin [B, 1, T, D])."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor] | None,
        write_at: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:  # training / no cache: plain causal attention over this sequence
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            cache_k, cache_v = kv
            rows = torch.arange(b, device=x.device)[:, None]
            # write_at [B, T]: the absolute position of each new token; the cache is [B, n_kv, cap, D]
            cache_k[rows, :, write_at] = k.transpose(1, 2)
            cache_v[rows, :, write_at] = v.transpose(1, 2)
            span = mask.shape[-1]
            keys, values = cache_k[:, :, :span], cache_v[:, :, :span]
            group = self.n_heads // self.n_kv
            # Fold the query heads that share a kv head into the query-length axis: attention then
            # runs on the cache view as is, without repeating keys/values per query head.
            qf = q.reshape(b, self.n_kv, group * t, self.head_dim)
            out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask.repeat(1, 1, group, 1))
            out = out.reshape(b, self.n_heads, t, self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv, write_at, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, write_at, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed: int = 0) -> None:
        """HF's initialisation: normal(0, 0.02) for matrices, zeros for biases, ones for norms."""
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.02)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        start: torch.Tensor | None = None,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, V] (or [B, V] at positions `logits_at` [B] of the T new tokens).

        Without `cache`: a full causal pass (training). With `cache` (one (k, v) pair per layer,
        each [B, n_kv, capacity, head_dim]) and `start` [B]: the tokens are appended to each
        row's cached prefix of length start[b]; the cache is updated in place.
        """
        b, t = input_ids.shape
        offsets = torch.arange(t, device=input_ids.device)
        positions = offsets.expand(b, t) if start is None else start[:, None] + offsets
        cfg, dtype = self.config, self.lm_head.weight.dtype
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype)
        cos, sin = cos[:, None], sin[:, None]
        mask = None
        if cache is not None:
            span = int(positions.max()) + 1
            # Query at position p sees cached keys 0..p: the row's prefix plus the new tokens so far.
            mask = (torch.arange(span, device=input_ids.device) <= positions[..., None])[:, None]
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], positions, mask)
        if logits_at is not None:
            x = x[torch.arange(b, device=x.device), logits_at]
        return self.lm_head(self.model.norm(x))

    # ---- checkpoints -------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> CausalLM:
        """Load a HF checkpoint directory (config.json + *.safetensors, sharded or not)."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise PolicyError(f"{path} is not a checkpoint directory: no config.json")
        cfg = ModelConfig.from_hf(json.loads(cfg_file.read_text()))
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device=device).to(dtype)
        if cfg.tie_word_embeddings:  # to_empty un-ties parameters; tie them again
            model.lm_head.weight = model.model.embed_tokens.weight
        model.load_state_dict(load_safetensors_dir(path), strict=True)
        return model.eval()

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json and model.safetensors (tied lm_head omitted, as HF does)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config.to_hf(), indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(path / SAFETENSORS_NAME), metadata={"format": "pt"})

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        """Accept HF state dicts that omit the tied `lm_head.weight`; name what is missing or extra."""
        state = dict(state_dict)
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
            state["lm_head.weight"] = state.get("model.embed_tokens.weight")
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        expected = set(self.state_dict())
        missing, extra = expected - set(state), set(state) - expected
        if strict and (missing or extra):
            raise PolicyError(
                "state dict does not match the model: "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}"
            )
        own = self.state_dict()
        for name, value in state.items():  # every shape first: a mismatch must not leave a half copy
            if name in own and value is not None and own[name].shape != value.shape:
                shapes = f"{tuple(value.shape)} != model's {tuple(own[name].shape)}"
                raise PolicyError(f"{name}: shape {shapes}")
        with torch.no_grad():
            for name, value in state.items():
                if name in own and value is not None:
                    own[name].copy_(value)
        return nn.modules.module._IncompatibleKeys(sorted(missing), sorted(extra))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def load_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory's *.safetensors files (one file or shards)."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise PolicyError(f"no *.safetensors file in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def check_head_dim(cfg: ModelConfig) -> None:
    """vLLM's CPU attention rejects head_dim 16; keep the project's models at 32 or 64."""
    if cfg.head_dim not in (32, 64, 128):
        raise PolicyError(f"head_dim {cfg.head_dim} is not supported by vLLM's CPU backend (use 32, 64, 128)")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise PolicyError("num_attention_heads must be a multiple of num_key_value_heads")
    if not math.isfinite(cfg.rope_theta):
        raise PolicyError("rope_theta must be finite")
