"""The embedded torch engine: continuous batching over a slot KV cache, with session prefix reuse.

How it runs. `generate()` (asyncio) puts a request on a bounded queue and awaits a future; one
worker thread loops over *steps*. Each step:

1. applies a pending weight update, if any (see below);
2. admits queued requests into free rows of the running batch (up to `max_batch`), restoring a
   session's kept KV prefix when the new prompt starts with exactly the tokens it covers;
3. prefills every row that has more than one token not yet in its cache (new requests), in
   chunks of at most `prefill_tokens` padded tokens, and samples their next token;
4. runs ONE batched decode forward for all running rows and samples a token for each.

Rows that finish (EOS / stop token / stop string / max_tokens / context full) leave after each
sampling phase, so requests join and leave the batch at every step.

The KV cache is one tensor [layers, 2, rows, kv_heads, capacity, head_dim]; running request i
owns row i. Rows stay contiguous (a leaving row is replaced by the last one), so every forward
reads a plain slice of the cache, never a gathered copy. Capacity grows on demand.

Shared prompts. Requests admitted together with the same prompt (the server's `n > 1`) are
prefilled once: the others copy the first one's cache row and sample from its logits.

Memory. The cache is bounded by `kv_cache_bytes`: a request is admitted only while (rows) x
(longest reservation, prompt + max_tokens) fits, so it never has to grow past the budget (a lone
request is always admitted). When the engine goes idle the cache shrinks back to its initial size
and freed pages are returned to the OS, so a burst does not leave the process at its peak size.

Sessions. A request with `session_id` keeps its KV prefix (all tokens but the last sampled one)
when it finishes, in an LRU store bounded by `session_bytes`. The next request of the session
re-encodes only the tokens after that prefix, if its prompt starts with exactly those tokens;
otherwise it is prefilled in full (a miss, counted).

Weight updates: the ONE policy. An update is applied between two steps, atomically for the
batch. Tokens sampled before it carry the old version, tokens after it the new one. Every
running request keeps its tokens but its KV cache is dropped and rebuilt from its full token
sequence with the new weights before its next token, and all kept session prefixes are
discarded; so no token is ever computed from a mix of old and new weights, and no request is
aborted or corrupted. (A turn that spans an update therefore carries both versions.) The
caller names the version (the learner owns it); every tensor is checked before the swap, so an
update is applied whole or not at all.

Cancellation and failure. A cancelled `generate` (or a closed `stream`) marks its request; the
worker frees its row at the next step and counts it in `cancelled`. If the worker itself raises,
the engine is dead: every waiting request fails with `EngineDead`, `health()` says why, and new
requests are refused with `EngineDead` rather than hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams
from agentrl.serving.engine_api import (
    EngineDead,
    EngineOverloaded,
    GenerationChunk,
    StaleVersion,
    check_version,
)
from agentrl.serving.model import CausalLM
from agentrl.serving.request_checks import check_request
from agentrl.serving.sampling import sample
from agentrl.serving.weights import check_state_dict, read_checkpoint_tensors

INITIAL_ROWS, INITIAL_CAPACITY = 8, 256


@dataclass
class _Request:
    tokens: list[int]  # prompt, then every sampled token
    prompt_len: int
    params: SamplingParams
    session_id: str | None
    loop: asyncio.AbstractEventLoop
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    future: asyncio.Future | None = None  # generate(): resolved once with the whole result
    sink: asyncio.Queue | None = None  # stream(): receives a GenerationChunk per step
    cached: int = 0  # tokens whose keys/values are valid in this request's cache row
    cached_prompt: int = 0
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    sent: int = 0  # generated tokens already sent to a stream
    cancelled: bool = False
    done: bool = False
    kept: _Session | None = None  # a session prefix to copy into this request's row on admission

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def reserve(self) -> int:
        """The most cache positions this request can ever occupy."""
        return len(self.tokens) + self.params.max_tokens - len(self.generated)


@dataclass
class _Session:
    tokens: list[int]
    kv: torch.Tensor  # [layers, 2, kv_heads, len(tokens), head_dim]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass
class _Update:
    state: Mapping[str, torch.Tensor]
    version: int
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class EngineStats:
    requests: int = 0
    finished: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    shared_prompt_tokens: int = 0  # prefill saved by identical prompts admitted together (n > 1)
    generated_tokens: int = 0
    session_hits: int = 0
    session_misses: int = 0
    session_evictions: int = 0
    steps: int = 0
    weight_updates: int = 0
    cache_shrinks: int = 0
    kv_cache_peak_bytes: int = 0
    busy_s: float = 0.0  # worker time spent in steps (not waiting for work): busy fraction = d(busy_s)/dt


class TorchEngine:
    """An `Engine` over `CausalLM` on CPU or CUDA. See the module docstring for the behaviour."""

    def __init__(
        self,
        model: CausalLM,
        *,
        eos_token_ids: list[int],
        decode: Callable[[list[int]], str] | None = None,
        max_batch: int = 256,
        max_queue: int = 4096,
        prefill_tokens: int = 2048,
        kv_cache_bytes: int = 1 << 30,
        session_bytes: int = 256 << 20,
        seed: int = 0,
        version: int = 0,
    ) -> None:
        self.model = model.eval()
        self.cfg = model.config
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        self.max_batch, self.max_queue = max_batch, max_queue
        self.prefill_tokens = prefill_tokens
        self.max_len = self.cfg.max_position_embeddings
        c = self.cfg
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.bytes_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * elem
        # Never below one full-context row: a lone request must always fit.
        self.kv_cache_bytes = max(kv_cache_bytes, self.max_len * self.bytes_per_token)
        self.session_bytes = session_bytes
        self.stats = EngineStats()
        self._version = version
        self._generator = torch.Generator().manual_seed(seed)
        self._queue: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._followers: list[tuple[_Request, _Request]] = []  # (follower, leader) admitted this step
        self._updates: deque[_Update] = deque()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._session_total = 0  # bytes
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: str | None = None
        # The idle size of the cache (what it shrinks back to), within the budget.
        self._idle_capacity = min(INITIAL_CAPACITY, self.max_len)
        budget_tokens = self.kv_cache_bytes // self.bytes_per_token
        self._idle_rows = max(1, min(INITIAL_ROWS, budget_tokens // self._idle_capacity))
        self._cache = self._allocate(self._idle_rows, self._idle_capacity)
        self.stats.kv_cache_peak_bytes = self._idle_rows * self._idle_capacity * self.bytes_per_token

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs: Any
    ) -> TorchEngine:
        """Load a HF checkpoint directory: weights, EOS ids (config + generation_config), decoder."""
        from tokenizers import Tokenizer

        path = Path(path)
        model = CausalLM.from_pretrained(path, device=device, dtype=dtype)
        tok_file = path / "tokenizer.json"
        decode = None
        if tok_file.is_file():
            tok = Tokenizer.from_file(str(tok_file))
            decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
        eos: set[int] = set()
        for name in ("config.json", "generation_config.json"):
            if (path / name).is_file():
                value = json.loads((path / name).read_text()).get("eos_token_id")
                eos.update(v for v in (value if isinstance(value, list) else [value]) if v is not None)
        return cls(model, eos_token_ids=sorted(eos), decode=decode, **kwargs)

    # ---- the Engine protocol -----------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def health(self) -> str | None:
        return self._dead

    def metrics(self) -> dict[str, Any]:
        return {
            "running": len(self._running),
            "queued": len(self._queue),
            "cancelled": self.stats.cancelled,
            "kv_cache_bytes": self._cache.numel() * self._cache.element_size(),
            "kv_cache_budget_bytes": self.kv_cache_bytes,
            "sessions": len(self._sessions),
            "session_bytes": self._session_total,
            "session_budget_bytes": self.session_bytes,
            **asdict(self.stats),
        }

    async def start(self) -> None:
        if self._thread is None and self._dead is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="agentrl-engine", daemon=True)
            self._thread.start()

    async def stop(self) -> None:
        """Stop the worker; unfinished requests complete with finish_reason "abort"."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        for req in [*self._running, *self._queue]:
            self._finish(req, "abort")
        self._running.clear()
        self._queue.clear()

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        req = self._submit(prompt_token_ids, params, session_id, streaming=False)
        assert req.future is not None
        try:
            return await req.future
        except asyncio.CancelledError:
            self._cancel(req)
            raise

    async def stream(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> AsyncIterator[GenerationChunk]:
        req = self._submit(prompt_token_ids, params, session_id, streaming=True)
        assert req.sink is not None
        try:
            while True:
                item = await req.sink.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self._cancel(req)

    async def update_weights(self, source: str | Path | Mapping[str, torch.Tensor], version: int) -> int:
        """Check every tensor, then swap between two steps (module docstring); return `version`."""
        self._check_alive()
        check_version(self._version, version)
        state = await asyncio.to_thread(self._read_and_check, source)
        loop = asyncio.get_running_loop()
        update = _Update(state, version, loop.create_future(), loop)
        with self._cond:
            self._updates.append(update)
            self._cond.notify()
        if self._thread is None:  # not running: apply right here
            self._apply_updates()
        return int(await update.done)

    def drop_sessions(self, session_ids: list[str]) -> None:
        """Forget sessions' kept prefixes (episodes ended). Safe from any thread."""
        with self._cond:
            for session_id in session_ids:
                kept = self._sessions.pop(session_id, None)
                if kept is not None:
                    self._session_total -= kept.nbytes

    # ---- introspection -----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def kept_sessions(self) -> int:
        return len(self._sessions)

    # ---- submitting, checking, delivering ------------------------------------------------------

    def _submit(
        self, prompt: list[int], params: SamplingParams, session_id: str | None, *, streaming: bool
    ) -> _Request:
        self._validate(prompt, params)
        self._check_alive()
        if self._thread is None:
            raise PolicyError("the engine is not started; call `await engine.start()` first")
        loop = asyncio.get_running_loop()
        gen = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        req = _Request(
            tokens=list(prompt),
            prompt_len=len(prompt),
            params=params,
            session_id=session_id,
            loop=loop,
            stop_ids=self.eos_token_ids | frozenset(params.stop_token_ids),
            generator=gen,
        )
        if streaming:
            req.sink = asyncio.Queue()
        else:
            req.future = loop.create_future()
        with self._cond:
            if len(self._queue) >= self.max_queue:
                raise EngineOverloaded(f"request queue is full ({self.max_queue} waiting); retry later")
            self._queue.append(req)
            self.stats.requests += 1
            self._cond.notify()
        return req

    def _cancel(self, req: _Request) -> None:
        if not req.done:
            req.cancelled = True  # the worker frees its row at its next step
            with self._cond:
                self._cond.notify()

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDead(self._dead)

    def _validate(self, prompt: list[int], p: SamplingParams) -> None:
        vocab, can_decode = self.cfg.vocab_size, self.decode is not None
        check_request(prompt, p, context_len=self.max_len, vocab_size=vocab, can_decode=can_decode)

    def _read_and_check(self, source: str | Path | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = read_checkpoint_tensors(source) if isinstance(source, str | Path) else source
        optional = frozenset({"lm_head.weight"}) if self.cfg.tie_word_embeddings else frozenset()
        return check_state_dict(state, self.model.state_dict(), optional)

    def _deliver(self, req: _Request, reason: str | None) -> None:
        """Send a streaming request its new tokens; resolve a finished request. Worker thread."""
        if reason is not None:
            req.done = True
        if req.sink is not None:
            chunk = GenerationChunk(
                token_ids=req.generated[req.sent :],
                logprobs=req.logprobs[req.sent :],
                versions=req.versions[req.sent :],
                top_logprobs=req.top_logprobs[req.sent :],
                finish_reason=reason,
                prompt_tokens=req.prompt_len,
                cached_prompt_tokens=req.cached_prompt,
            )
            req.sent = len(req.generated)
            if chunk.token_ids or reason is not None:
                _call_soon(req.loop, req.sink.put_nowait, chunk)
        elif reason is not None and req.future is not None:
            result = GenerationResult(
                token_ids=req.generated,
                logprobs=req.logprobs,
                versions=req.versions,
                finish_reason=reason,
                prompt_tokens=req.prompt_len,
                cached_prompt_tokens=req.cached_prompt,
                top_logprobs=req.top_logprobs,
            )
            _call_soon(req.loop, _set_result, req.future, result)

    def _finish(self, req: _Request, reason: str) -> None:
        self._deliver(req, reason)

    def _fail(self, req: _Request, exc: BaseException) -> None:
        req.done = True
        if req.sink is not None:
            _call_soon(req.loop, req.sink.put_nowait, exc)
        elif req.future is not None:
            _call_soon(req.loop, _set_exception, req.future, exc)

    # ---- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    if not (self._stopping or self._queue or self._running or self._updates):
                        self._shrink_when_idle()
                    while not (self._stopping or self._queue or self._running or self._updates):
                        self._cond.wait()
                    if self._stopping:
                        return
                started = time.perf_counter()
                try:
                    self._step()
                except Exception as exc:  # a bug or a device error: fail loudly, never hang
                    self._die(f"torch engine decode loop died: {type(exc).__name__}: {exc}")
                    return
                self.stats.busy_s += time.perf_counter() - started

    def _die(self, reason: str) -> None:
        self._dead = reason
        error = EngineDead(reason)
        with self._cond:
            waiting = [*self._running, *self._queue]
            updates = list(self._updates)
            self._running.clear()
            self._queue.clear()
            self._updates.clear()
        for req in waiting:
            self._fail(req, error)
        for update in updates:
            _call_soon(update.loop, _set_exception, update.done, error)

    def _step(self) -> None:
        self._apply_updates()
        self._drop_cancelled()
        self._admit()
        if not self._running:
            return
        self.stats.steps += 1
        first = next((i for i, r in enumerate(self._running) if len(r.tokens) - r.cached > 1), None)
        if first is not None:
            self._prefill(first)
            self._retire()
        self._followers = []
        if self._running:
            self._decode()
            self._retire()

    def _apply_updates(self) -> None:
        with self._cond:
            updates = list(self._updates)
            self._updates.clear()
        for update in updates:
            try:
                check_version(self._version, update.version)  # a later push may have overtaken this one
            except StaleVersion as stale:
                _call_soon(update.loop, _set_exception, update.done, stale)
                continue
            # Checked in full by update_weights: copying cannot fail half way.
            self.model.load_state_dict(update.state, strict=True)
            self._version = update.version
            self.stats.weight_updates += 1
            for req in self._running:
                req.cached = 0  # rebuilt from the full token sequence with the new weights
            with self._cond:
                self._sessions.clear()
                self._session_total = 0
            _call_soon(update.loop, _set_result, update.done, update.version)

    def _drop_cancelled(self) -> None:
        with self._cond:
            before = len(self._queue)
            self._queue = deque(r for r in self._queue if not r.cancelled)
            self.stats.cancelled += before - len(self._queue)
        for i in reversed(range(len(self._running))):
            if self._running[i].cancelled:
                self.stats.cancelled += 1
                self._running[i].done = True
                self._remove(i)

    def _admit(self) -> None:
        admitted: list[_Request] = []
        budget = 4 * self.prefill_tokens
        budget_tokens = self.kv_cache_bytes // self.bytes_per_token
        widest = max((min(r.reserve, self.max_len) for r in self._running), default=0)
        with self._cond:
            while self._queue and len(self._running) + len(admitted) < self.max_batch and budget > 0:
                req = self._queue[0]
                rows = len(self._running) + len(admitted) + 1
                wide = max(widest, min(req.reserve, self.max_len))
                if rows * wide > budget_tokens and rows > 1:
                    break  # the KV budget is full: wait for a running request to leave
                self._queue.popleft()
                widest = wide
                self._attach_session(req)
                budget -= len(req.tokens) - req.cached
                admitted.append(req)
        if not admitted:
            return
        # Identical fresh prompts (n > 1) are prefilled once; the copies go last, after every row
        # that needs a prefill, and take their leader's cache row and logits.
        leaders: dict[tuple[int, ...], _Request] = {}
        fresh: list[_Request] = []
        self._followers = []
        for req in admitted:
            key = tuple(req.tokens)
            if req.kept is None and req.cached == 0 and len(key) > 1 and key in leaders:
                self._followers.append((req, leaders[key]))
                self.stats.shared_prompt_tokens += len(req.tokens)
            else:
                if req.kept is None and req.cached == 0:
                    leaders[key] = req
                fresh.append(req)
        # Similar lengths side by side: less padding in the prefill chunks.
        fresh.sort(key=lambda r: len(r.tokens) - r.cached)
        self._ensure_rows(len(self._running) + len(admitted))
        for req in [*fresh, *(f for f, _ in self._followers)]:
            row = len(self._running)
            self._running.append(req)
            if req.kept is not None:
                self._ensure_capacity(req.cached)
                self._cache[:, :, row, :, : req.cached] = req.kept.kv[:, :, :, : req.cached]
                req.kept = None

    def _attach_session(self, req: _Request) -> None:
        """Called under the lock: reuse the session's kept prefix if the prompt extends it exactly."""
        self.stats.prompt_tokens += req.prompt_len
        if req.session_id is None:
            return
        kept = self._sessions.pop(req.session_id, None)
        if kept is None:
            self.stats.session_misses += 1
            return
        self._session_total -= kept.nbytes
        n = len(kept.tokens)
        if req.tokens[:n] != kept.tokens:
            self.stats.session_misses += 1
            return
        n = min(n, len(req.tokens) - 1)  # at least one token must be fed to get logits
        self.stats.session_hits += 1
        self.stats.cached_prompt_tokens += n
        req.cached = req.cached_prompt = n
        req.kept = kept

    # ---- cache storage ------------------------------------------------------------------------

    def _allocate(self, rows: int, capacity: int) -> torch.Tensor:
        c = self.cfg
        shape = (c.num_hidden_layers, 2, rows, c.num_key_value_heads, capacity, c.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _resize(self, rows_needed: int, capacity_needed: int) -> None:
        """Grow to at least the needs (doubling when the KV budget allows, else exactly)."""
        have_rows, have_cap = self._cache.shape[2], self._cache.shape[4]
        rows, cap = have_rows, have_cap
        if rows_needed > have_rows:
            rows = max(rows_needed, min(self.max_batch, 2 * have_rows))
        if capacity_needed > have_cap:
            cap = min(self.max_len, max(capacity_needed, 2 * have_cap))
        if rows * cap * self.bytes_per_token > self.kv_cache_bytes:
            in_use = max((r.cached for r in self._running), default=0)
            rows = max(rows_needed, len(self._running))
            cap = max(capacity_needed, in_use, 1)
        old, self._cache = self._cache, self._allocate(rows, cap)
        self.stats.kv_cache_peak_bytes = max(
            self.stats.kv_cache_peak_bytes, rows * cap * self.bytes_per_token
        )
        keep_rows, keep_cap = min(rows, have_rows), min(cap, have_cap)
        self._cache[:, :, :keep_rows, :, :keep_cap] = old[:, :, :keep_rows, :, :keep_cap]

    def _ensure_rows(self, rows: int) -> None:
        if self._cache.shape[2] < rows:
            self._resize(rows, self._cache.shape[4])

    def _ensure_capacity(self, length: int) -> None:
        if self._cache.shape[4] < length:
            self._resize(self._cache.shape[2], length)

    def _shrink_when_idle(self) -> None:
        """Called under the lock with nothing to do: give a burst's cache memory back."""
        if self._cache.shape[2] * self._cache.shape[4] > self._idle_rows * self._idle_capacity:
            self._cache = self._allocate(self._idle_rows, self._idle_capacity)
            self.stats.cache_shrinks += 1
            _release_free_memory(self.device)

    def _views(self, a: int, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache = self._cache
        return [(cache[layer, 0, a:b], cache[layer, 1, a:b]) for layer in range(self.cfg.num_hidden_layers)]

    # ---- forward passes -----------------------------------------------------------------------

    def _prefill(self, first: int) -> None:
        """Encode every row from `first` on that has uncached tokens; sample their next token."""
        followers, self._followers = self._followers, []
        end = len(self._running) - len(followers)
        rows = list(range(first, end))
        reqs: list[_Request] = []
        logits: list[torch.Tensor] = []
        start = 0
        while start < len(rows):
            stop, width = start, 0
            while stop < len(rows):
                r = self._running[rows[stop]]
                w = max(width, len(r.tokens) - r.cached)
                if stop > start and w * (stop - start + 1) > self.prefill_tokens:
                    break
                width, stop = w, stop + 1
            a, b = rows[start], rows[stop - 1] + 1
            logits.append(self._prefill_chunk(a, b, width))
            reqs.extend(self._running[a:b])
            start = stop
        if followers:
            row_of = {id(r): i for i, r in enumerate(self._running)}
            index_of = {id(r): i for i, r in enumerate(reqs)}
            picks = []
            for follower, leader in followers:
                n = leader.cached
                self._cache[:, :, row_of[id(follower)], :, :n] = self._cache[:, :, row_of[id(leader)], :, :n]
                follower.cached = n
                reqs.append(follower)
                picks.append(index_of[id(leader)])
            all_logits = torch.cat(logits)
            logits = [all_logits, all_logits[torch.tensor(picks, device=all_logits.device)]]
        self._sample_rows(reqs, torch.cat(logits))

    def _prefill_chunk(self, a: int, b: int, width: int) -> torch.Tensor:
        reqs = self._running[a:b]
        ids = torch.zeros(b - a, width, dtype=torch.long)
        for i, r in enumerate(reqs):
            new = r.tokens[r.cached :]
            ids[i, : len(new)] = torch.tensor(new)
        start = torch.tensor([r.cached for r in reqs])
        last = torch.tensor([len(r.tokens) - r.cached - 1 for r in reqs])
        self._ensure_capacity(int((start + width).max()))
        dev = self.device
        logits = self.model(ids.to(dev), cache=self._views(a, b), start=start.to(dev), logits_at=last.to(dev))
        for r in reqs:
            r.cached = len(r.tokens)
        return logits

    def _decode(self) -> None:
        reqs = self._running
        ids = torch.tensor([[r.tokens[-1]] for r in reqs], device=self.device)
        start = torch.tensor([r.cached for r in reqs], device=self.device)
        self._ensure_capacity(max(r.cached for r in reqs) + 1)
        at = torch.zeros_like(start)
        logits = self.model(ids, cache=self._views(0, len(reqs)), start=start, logits_at=at)
        for r in reqs:
            r.cached += 1
        self._sample_rows(reqs, logits)

    def _sample_rows(self, reqs: list[_Request], logits: torch.Tensor) -> None:
        dev = logits.device
        temperature = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float64, device=dev)
        top_p = torch.tensor([r.params.top_p for r in reqs], dtype=torch.float64, device=dev)
        uniforms = torch.rand(len(reqs), generator=self._generator)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                uniforms[i] = torch.rand(1, generator=r.generator)
        top_k = max(r.params.top_logprobs for r in reqs)
        out = sample(logits, temperature, top_p, uniforms.to(dev), top_k=top_k)
        tops: list[list[tuple[int, float]]] = [[] for _ in reqs]
        if out.top_ids is not None and out.top_logprobs is not None:
            ids, lps = out.top_ids.tolist(), out.top_logprobs.tolist()
            tops = [list(zip(i, lp, strict=True)) for i, lp in zip(ids, lps, strict=True)]
        for r, tok, lp, top in zip(reqs, out.tokens.tolist(), out.logprobs.tolist(), tops, strict=True):
            r.tokens.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self._version)
            if r.params.top_logprobs:
                r.top_logprobs.append(top[: r.params.top_logprobs])
        self.stats.generated_tokens += len(reqs)

    # ---- leaving the batch --------------------------------------------------------------------

    def _finish_reason(self, r: _Request) -> str | None:
        generated = len(r.tokens) - r.prompt_len
        if generated == 0:
            return None
        if r.tokens[-1] in r.stop_ids:
            return "stop"
        if r.params.stop and self.decode is not None:
            longest = max(len(s) for s in r.params.stop)
            tail = self.decode(r.generated[-(4 * longest + 4) :])
            if any(s in tail for s in r.params.stop):
                return "stop"
        if generated >= r.params.max_tokens or len(r.tokens) >= self.max_len:
            return "length"
        return None

    def _retire(self) -> None:
        for i in reversed(range(len(self._running))):
            req = self._running[i]
            reason = self._finish_reason(req)
            if reason is None:
                if req.sink is not None:
                    self._deliver(req, None)
                continue
            if req.session_id is not None:
                self._keep_session(req, i)
            self.stats.finished += 1
            self._finish(req, reason)
            self._remove(i)

    def _keep_session(self, req: _Request, row: int) -> None:
        n = req.cached  # the last sampled token was never fed, so it has no keys/values yet
        session = _Session(tokens=req.tokens[:n], kv=self._cache[:, :, row, :, :n].clone())
        if session.nbytes > self.session_bytes:
            return
        assert req.session_id is not None
        with self._cond:
            self._sessions[req.session_id] = session
            self._session_total += session.nbytes
            while self._session_total > self.session_bytes and self._sessions:
                _, old = self._sessions.popitem(last=False)
                self._session_total -= old.nbytes
                self.stats.session_evictions += 1

    def _remove(self, row: int) -> None:
        """Free `row`; the last running row moves into it so rows stay contiguous."""
        last = len(self._running) - 1
        if row != last:
            moved = self._running[last]
            n = moved.cached
            self._cache[:, :, row, :, :n] = self._cache[:, :, last, :, :n]
            self._running[row] = moved
        self._running.pop()


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting
        loop.call_soon_threadsafe(fn, *args)


def _set_result(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _release_free_memory(device: torch.device) -> None:
    """Return freed heap pages to the OS (glibc keeps them otherwise) and CUDA's cached blocks."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
