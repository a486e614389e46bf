"""A latency-model engine: the `Engine` interface with time taken from a profile instead of a model.

It schedules like the embedded engine (continuous batching: requests join and leave the running
batch at every step, one decode step gives every running request one token, a request's new
tokens are prefilled before it decodes, a multi-turn session's kept prefix is not re-encoded) but
each step *waits* the time the profile gives instead of computing:

    decode step:  decode_base_s + decode_per_seq_s * batch + decode_per_ctx_token_s * sum(context)
    prefill:      prefill_base_s + prefill_per_token_s * new_tokens
                  (with chunked_prefill: prefill_per_token_s * new_tokens added to a decode step)
    KV capacity:  kv_capacity_tokens of context resident at once (more waits in the queue; a
                  batch that outgrows it preempts its newest request, which later recomputes)
    weight sync:  weight_sync_s between two steps, every running request kept ("keep" policy)

The response length of each request comes from `response_tokens` (a distribution; capped by
`max_tokens` and the context), times, with `prompt_factor`, a factor drawn once per distinct
prompt (seeded by the prompt's ids, so every sample of one prompt, re-rolled or not, shares it:
hard prompts whose responses all run long, the premise of tail batching), and the tokens are
real ids drawn from `token_pool`, ending with EOS when the length was not cut short, so the
client, the ledger and the trainer run unchanged.
Waiting is `asyncio` time: on a normal loop the engine takes real seconds, on
`agentrl.sim.clock.VirtualClockLoop` virtual ones (see there for what that leaves out).

Profiles are JSON (`LatencyProfile.load`): one fitted to a measured run of the embedded engine on
this machine (`bench/calibrate_latency.py`), or one for a GPU whose numbers are assumptions (the
file's `source` says which). `stats.busy_s` counts the seconds spent in steps and weight syncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import random
import struct
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import InvalidArgumentError, PolicyError
from agentrl.generation import GenerationResult, SamplingParams
from agentrl.serving.engine_api import EngineOverloaded, GenerationChunk, InvalidRequest, check_version
from agentrl.sim.distributions import Distribution
from agentrl.sim.profiles import profile_from_mapping, read_profile


@dataclass(frozen=True)
class LatencyProfile:
    """How long an engine's steps take. `source` says whether the numbers were measured or assumed."""

    name: str
    source: str
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_base_s: float
    prefill_per_token_s: float
    kv_capacity_tokens: int
    max_batch: int
    max_len: int = 32768
    weight_sync_s: float = 0.0
    chunked_prefill: bool = False  # new requests' prefill rides on a decode step (vLLM) or not (TorchEngine)
    notes: str = ""

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        per_seq, per_token = self.decode_per_seq_s, self.decode_per_ctx_token_s
        return self.decode_base_s + per_seq * batch + per_token * context_tokens

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens

    def saturated_tokens_per_s(self, mean_context: float) -> float:
        """Decode tokens/s with the batch as full as max_batch and the KV capacity allow."""
        batch = max(1, min(self.max_batch, int(self.kv_capacity_tokens // max(mean_context, 1.0))))
        return batch / self.decode_step_s(batch, int(batch * mean_context))

    @classmethod
    def load(cls, path: str | Path) -> LatencyProfile:
        """Read a profile file: its `engine` section (or the whole file if it has none)."""
        data = read_profile(path, "latency")
        return cls.from_mapping(data.get("engine", data), where=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "latency profile") -> LatencyProfile:
        return profile_from_mapping(cls, data, where)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LatencyEngineStats:
    requests: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    cancelled: int = 0
    steps: int = 0
    preemptions: int = 0
    weight_updates: int = 0
    decode_tokens: int = 0  # tokens sampled by decode steps (not by prefills)
    decode_context_tokens: int = 0  # sum over decode steps of the batch's context: / decode_tokens = mean
    busy_s: float = 0.0
    weight_sync_s: float = 0.0


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    target: int  # tokens this response will have (sampled at submission)
    stop_at_end: bool  # whether the last token is EOS (the length was not cut by a limit)
    session_id: str | None
    future: asyncio.Future[GenerationResult]
    generated: int = 0
    uncached: int = 0  # tokens to prefill before the next decode step
    cached_prompt: int = 0
    cancelled: bool = False
    version_marks: list[tuple[int, int]] = field(default_factory=list)  # (generated, version) changes

    @property
    def context(self) -> int:
        return len(self.prompt) + self.generated


class LatencyEngine:
    """An `Engine` whose steps wait the profile's times. See the module docstring."""

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        response_tokens: Distribution,
        eos_token_id: int,
        token_pool: Sequence[int],
        vocab_size: int | None = None,
        seed: int = 0,
        max_queue: int = 1 << 20,
        session_tokens: int | None = None,
        version: int = 0,
        prompt_factor: Distribution | None = None,
    ) -> None:
        if not token_pool:
            raise InvalidArgumentError("token_pool must not be empty")
        self.profile = profile
        self.response_tokens = response_tokens
        self.prompt_factor = prompt_factor
        self._seed = seed
        self.eos_token_id = eos_token_id
        self.token_pool = list(token_pool)
        # responses are slices of one long random sequence over the pool: cheap, and real ids
        self._stream = random.Random(seed + 1).choices(self.token_pool, k=1 << 16)
        self.vocab_size = vocab_size
        self.max_queue = max_queue
        self.session_tokens = session_tokens if session_tokens is not None else profile.kv_capacity_tokens
        self.stats = LatencyEngineStats()
        self._version = version
        self._rng = random.Random(seed)
        self._logprob = -math.log(len(set(self.token_pool)))
        self._queue: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._resident = 0  # sum of context over running requests
        self._sessions: OrderedDict[str, list[int]] = OrderedDict()
        self._session_total = 0
        self._updates: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[bool] | None = None
        self._idle = asyncio.Event()

    # ---- the Engine protocol ---------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def health(self) -> str | None:
        if self._worker is not None and self._worker.done() and not self._worker.cancelled():
            return f"latency engine worker died: {self._worker.exception()!r}"
        return None

    async def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._run(), name="latency-engine")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        for req in [*self._running, *self._queue]:
            self._resolve(req, "abort")
        self._running.clear()
        self._queue.clear()
        self._resident = 0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        self._validate(prompt_token_ids, params)
        if self._worker is None:
            raise PolicyError("the engine is not started; call `await engine.start()` first")
        if len(self._queue) >= self.max_queue:
            raise EngineOverloaded(f"request queue is full ({self.max_queue} waiting); retry later")
        room = min(self.profile.max_len, self.profile.kv_capacity_tokens) - len(prompt_token_ids)
        wanted = self._wanted_tokens(prompt_token_ids)
        target = max(1, min(wanted, params.max_tokens, room))
        req = _Request(
            prompt=list(prompt_token_ids),
            target=target,
            stop_at_end=target == wanted,
            session_id=session_id,
            future=asyncio.get_running_loop().create_future(),
            version_marks=[(0, self._version)],
        )
        self._attach_session(req)
        self._queue.append(req)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(req.prompt)
        self._poke()
        try:
            return await req.future
        except asyncio.CancelledError:
            self._cancel(req)
            raise

    def stream(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        """`generate` as one chunk when the response is complete (the model has no per-token times)."""

        async def chunks() -> AsyncIterator[GenerationChunk]:
            result = await self.generate(prompt_token_ids, params, session_id=session_id)
            yield GenerationChunk(
                result.token_ids,
                result.logprobs,
                result.versions,
                finish_reason=result.finish_reason,
                prompt_tokens=result.prompt_tokens,
                cached_prompt_tokens=result.cached_prompt_tokens,
            )

        return chunks()

    async def update_weights(self, source: Any, version: int) -> int:
        """Wait `weight_sync_s` between two steps, then stamp `version` on new tokens (no weights)."""
        check_version(self._version, version)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._updates.append((version, done))
        self._poke(force=True)
        return await done

    # ---- introspection ---------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def metrics(self) -> dict[str, Any]:
        return {
            "running": len(self._running),
            "queued": len(self._queue),
            "cancelled": self.stats.cancelled,
            "kv_cache_bytes": None,  # modelled: the profile counts KV in tokens
            "kv_cache_tokens": self._resident,
            "sessions": len(self._sessions),
            "session_bytes": None,
            "session_tokens": self._session_total,
            "modelled": True,
            **asdict(self.stats),
        }

    def drop_sessions(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            kept = self._sessions.pop(session_id, None)
            if kept is not None:
                self._session_total -= len(kept)

    # ---- requests ----------------------------------------------------------------------------

    def _validate(self, prompt: list[int], p: SamplingParams) -> None:
        if not prompt:
            raise InvalidRequest("prompt_token_ids is empty")
        if len(prompt) >= self.profile.max_len:
            raise InvalidRequest(f"prompt has {len(prompt)} tokens; the context holds {self.profile.max_len}")
        if self.vocab_size is not None and any(not 0 <= t < self.vocab_size for t in prompt):
            raise InvalidRequest(f"token ids out of range [0, {self.vocab_size})")
        if p.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {p.max_tokens}")
        if p.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {p.temperature}")
        if not 0 < p.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {p.top_p}")

    def _wanted_tokens(self, prompt: list[int]) -> int:
        """The response length this request would reach without a limit."""
        tokens = self.response_tokens.sample(self._rng)
        if self.prompt_factor is not None:
            digest = hashlib.blake2b(struct.pack(f"<q{len(prompt)}q", self._seed, *prompt), digest_size=8)
            tokens *= self.prompt_factor.sample(random.Random(digest.digest()))
        return max(1, round(tokens))

    def _attach_session(self, req: _Request) -> None:
        req.uncached = len(req.prompt)
        if req.session_id is None:
            return
        kept = self._sessions.pop(req.session_id, None)
        if kept is None:
            return
        self._session_total -= len(kept)
        n = len(kept)
        if n < len(req.prompt) and req.prompt[:n] == kept:
            req.uncached -= n
            req.cached_prompt = n
            self.stats.cached_prompt_tokens += n

    def _keep_session(self, req: _Request, tokens: list[int]) -> None:
        if req.session_id is None:
            return
        kept = req.prompt + tokens[:-1]
        self._sessions[req.session_id] = kept
        self._session_total += len(kept)
        while self._session_total > self.session_tokens and self._sessions:
            _, old = self._sessions.popitem(last=False)
            self._session_total -= len(old)

    def _cancel(self, req: _Request) -> None:
        req.cancelled = True
        self.stats.cancelled += 1
        if req in self._queue:
            self._queue.remove(req)
        elif req in self._running:
            self._running.remove(req)
            self._resident -= req.context

    def _tokens(self, n: int) -> list[int]:
        stream = self._stream
        start = self._rng.randrange(len(stream))
        tokens = stream[start : start + n]
        while len(tokens) < n:
            tokens += stream[: n - len(tokens)]
        return tokens

    def _resolve(self, req: _Request, reason: str) -> None:
        n = req.generated
        tokens = self._tokens(n)
        if reason == "stop" and req.stop_at_end and n:
            tokens[-1] = self.eos_token_id
        versions: list[int] = []
        marks = [*req.version_marks, (n, -1)]
        for (start, version), (end, _) in itertools.pairwise(marks):
            versions.extend([version] * (max(end, start) - start))
        result = GenerationResult(
            token_ids=tokens,
            logprobs=[self._logprob] * n,
            versions=versions[:n],
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            cached_prompt_tokens=req.cached_prompt,
        )
        if reason != "abort":
            self._keep_session(req, tokens)
        if not req.future.done():
            req.future.set_result(result)

    # ---- the worker --------------------------------------------------------------------------

    def _poke(self, *, force: bool = False) -> None:
        """Wake the worker: at once if it is idle; mid-decode only if a request could join."""
        joinable = force or not self._running or len(self._running) < self.profile.max_batch
        if self._wake is not None and not self._wake.done() and joinable:
            self._wake.set_result(True)

    async def _pause(self, seconds: float, *, wakeable: bool) -> float:
        """Wait `seconds` (None/inf: until poked); return the seconds actually waited."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        if not wakeable:
            await asyncio.sleep(seconds)
            return loop.time() - started
        self._wake = loop.create_future()
        handle = None if math.isinf(seconds) else loop.call_later(seconds, _set, self._wake, False)
        try:
            await self._wake
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None
        return loop.time() - started

    async def _busy(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.stats.busy_s += seconds

    async def _run(self) -> None:
        while True:
            if self._updates:
                await self._apply_updates()
                continue
            self._admit()
            if not self._running:
                await self._pause(math.inf, wakeable=True)
                continue
            fresh = [r for r in self._running if r.uncached > 0]
            if fresh:
                await self._prefill(fresh)
                continue
            await self._decode()

    async def _prefill(self, fresh: list[_Request]) -> None:
        """Encode the new tokens of `fresh` and sample their next token. With `chunked_prefill`
        (vLLM's default) the same step also decodes every other running request, and costs a
        decode step plus the per-token prefill time; otherwise it is a step of its own."""
        tokens = sum(r.uncached for r in fresh)
        others = [r for r in self._running if r.uncached == 0] if self.profile.chunked_prefill else []
        if others:
            context = sum(r.context for r in others)
            seconds = (
                self.profile.decode_step_s(len(others), context) + self.profile.prefill_per_token_s * tokens
            )
        else:
            seconds = self.profile.prefill_s(tokens)
        await self._busy(seconds)
        self.stats.prefilled_tokens += tokens
        fresh = [r for r in fresh if not r.cancelled]  # a caller may have left meanwhile
        for r in fresh:
            r.uncached = 0
        others = [r for r in others if not r.cancelled]
        if others:
            self.stats.decode_tokens += len(others)
            self.stats.decode_context_tokens += sum(r.context for r in others)
        self._advance(fresh + others, 1)  # every request in the step samples its next token
        self.stats.steps += 1
        self._retire()

    async def _apply_updates(self) -> None:
        seconds = self.profile.weight_sync_s
        if seconds > 0:
            await self._busy(seconds)
            self.stats.weight_sync_s += seconds
        while self._updates:
            version, done = self._updates.popleft()
            self._version = max(self._version, version)
            self.stats.weight_updates += 1
            for r in [*self._running, *self._queue]:
                r.version_marks.append((r.generated, self._version))
            _set(done, self._version)

    def _admit(self) -> None:
        capacity = self.profile.kv_capacity_tokens
        while self._queue and len(self._running) < self.profile.max_batch:
            req = self._queue[0]
            if self._running and self._resident + req.context + len(self._running) > capacity:
                return
            self._queue.popleft()
            self._running.append(req)
            self._resident += req.context

    def _advance(self, reqs: list[_Request], steps: int) -> None:
        for r in reqs:
            r.generated += steps
        self._resident += steps * len(reqs)
        self.stats.generated_tokens += steps * len(reqs)

    def _retire(self) -> None:
        done = [r for r in self._running if r.generated >= r.target]
        if not done:
            return
        self._running = [r for r in self._running if r.generated < r.target]
        for r in done:
            self._resident -= r.context
            self.stats.finished += 1
            self._resolve(r, "stop" if r.stop_at_end else "length")

    async def _decode(self) -> None:
        """Run decode steps up to the next finish (or KV limit); stop early, at a step boundary,
        when a new request arrives that could join the batch."""
        running = self._running
        batch = len(running)
        room = (self.profile.kv_capacity_tokens - self._resident) // batch
        if room < 1:
            victim = running.pop()  # the newest request leaves and will recompute its context
            self._resident -= victim.context
            victim.uncached = victim.context
            victim.cached_prompt = 0
            self._queue.appendleft(victim)
            self.stats.preemptions += 1
            return
        steps = min(min(r.target - r.generated for r in running), room)
        first = self.profile.decode_step_s(batch, self._resident)
        grow = self.profile.decode_per_ctx_token_s * batch  # each step, every context is one longer

        def duration(k: int) -> float:
            return k * first + grow * k * (k - 1) / 2

        total = duration(steps)
        joinable = len(running) < self.profile.max_batch
        waited = await self._pause(total, wakeable=joinable)
        if waited < total:  # woken by an arrival: finish the step in flight, then let it join
            done = _steps_within(waited, first, grow, steps)
            rest = duration(done) - waited
            if rest > 0:
                await asyncio.sleep(rest)
            waited = duration(done)
            steps = done
        self.stats.busy_s += waited
        self.stats.steps += steps
        self.stats.decode_tokens += steps * batch
        self.stats.decode_context_tokens += steps * self._resident + batch * steps * (steps - 1) // 2
        self._advance(running, steps)
        self._retire()


def _steps_within(elapsed: float, first: float, grow: float, limit: int) -> int:
    """The number of steps (at least 1, at most `limit`) whose end is at or after `elapsed`."""
    if grow <= 0:
        k = math.ceil(elapsed / first - 1e-12) if first > 0 else 1
    else:  # smallest k with k*first + grow*k*(k-1)/2 >= elapsed
        a, b = grow / 2, first - grow / 2
        k = math.ceil((-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a) - 1e-9)
    return max(1, min(limit, k))


def _set(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
