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

Sessions. A request with `session_id` keeps its KV prefix (all tokens but the last sampled one)
when it finishes, in an LRU store bounded by `session_tokens`. The next request of the session
re-encodes only the tokens after that prefix, if its prompt starts with exactly those tokens;
otherwise it is prefilled in full (a miss, counted).

Weight updates: the ONE policy. An update is applied between two steps, atomically for the
batch. Tokens sampled before it carry the old version, tokens after it the new one. Every
running request keeps its tokens but its KV cache is dropped and rebuilt from its full token
sequence with the new weights before its next token, and all kept session prefixes are
discarded; so no token is ever computed from a mix of old and new weights, and no request is
aborted or corrupted. (A turn that spans an update therefore carries both versions.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.errors import PolicyError
from agentrl.generation import GenerationResult, SamplingParams
from agentrl.serving.engine_api import EngineOverloaded, InvalidRequest, check_version
from agentrl.serving.model import CausalLM, load_safetensors_dir
from agentrl.serving.sampling import sample


@dataclass
class _Request:
    tokens: list[int]  # prompt, then every sampled token
    prompt_len: int
    params: SamplingParams
    session_id: str | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    cached: int = 0  # tokens whose keys/values are valid in this request's cache row
    cached_prompt: int = 0
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cancelled: bool = False
    kept: _Session | None = None  # a session prefix to copy into this request's row on admission

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass
class _Session:
    tokens: list[int]
    kv: torch.Tensor  # [layers, 2, kv_heads, len(tokens), head_dim]


_Update = tuple[Mapping[str, torch.Tensor], int, asyncio.Future, asyncio.AbstractEventLoop]


@dataclass
class EngineStats:
    requests: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    session_hits: int = 0
    session_misses: int = 0
    steps: int = 0
    weight_updates: int = 0


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
        session_tokens: int = 1_000_000,
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
        self.prefill_tokens, self.session_tokens = prefill_tokens, session_tokens
        self.max_len = self.cfg.max_position_embeddings
        self.stats = EngineStats()
        self._version = version  # the trainer's number for these weights (see update_weights)
        self._generator = torch.Generator().manual_seed(seed)
        self._queue: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._updates: deque[_Update] = deque()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._session_total = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._cache = self._allocate(rows=8, capacity=256)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32, **kwargs
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

    async def start(self) -> None:
        if self._thread is None:
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
            self._resolve(req, "abort")
        self._running.clear()
        self._queue.clear()

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, session_id: str | None = None
    ) -> GenerationResult:
        self._validate(prompt_token_ids, params)
        if self._thread is None:
            raise PolicyError("the engine is not started; call `await engine.start()` first")
        loop = asyncio.get_running_loop()
        gen = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        req = _Request(
            tokens=list(prompt_token_ids),
            prompt_len=len(prompt_token_ids),
            params=params,
            session_id=session_id,
            future=loop.create_future(),
            loop=loop,
            stop_ids=self.eos_token_ids | frozenset(params.stop_token_ids),
            generator=gen,
        )
        with self._cond:
            if len(self._queue) >= self.max_queue:
                raise EngineOverloaded(f"request queue is full ({self.max_queue} waiting); retry later")
            self._queue.append(req)
            self.stats.requests += 1
            self._cond.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # the worker drops it at its next step
            raise

    async def update_weights(self, source: str | Path | Mapping[str, torch.Tensor], version: int) -> int:
        """Swap weights between two steps (policy in the module docstring), stamped `version`."""
        check_version(self._version, version)
        if isinstance(source, str | Path):
            state: Mapping[str, torch.Tensor] = await asyncio.to_thread(load_safetensors_dir, source)
        else:
            state = source
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        with self._cond:
            self._updates.append((state, version, done, loop))
            self._cond.notify()
        if self._thread is None:  # not running: apply right here
            self._apply_updates()
        return await done

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

    def drop_session(self, session_id: str) -> None:
        """Forget a session's kept prefix (the episode ended). Safe from any thread."""
        with self._cond:
            kept = self._sessions.pop(session_id, None)
            if kept is not None:
                self._session_total -= len(kept.tokens)

    # ---- request checks and results ------------------------------------------------------------

    def _validate(self, prompt: list[int], p: SamplingParams) -> None:
        if not prompt:
            raise InvalidRequest("prompt_token_ids is empty")
        if len(prompt) >= self.max_len:
            raise InvalidRequest(f"prompt has {len(prompt)} tokens; the context holds {self.max_len}")
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise InvalidRequest(f"token ids out of range [0, {self.cfg.vocab_size}): {bad[:5]}")
        if p.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {p.max_tokens}")
        if p.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {p.temperature}")
        if not 0 < p.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {p.top_p}")
        if p.stop and self.decode is None:
            raise InvalidRequest("stop strings need a tokenizer; this engine has none")

    def _resolve(self, req: _Request, reason: str) -> None:
        result = GenerationResult(
            token_ids=req.generated,
            logprobs=req.logprobs,
            versions=req.versions,
            finish_reason=reason,
            prompt_tokens=req.prompt_len,
            cached_prompt_tokens=req.cached_prompt,
        )

        def deliver() -> None:
            if not req.future.done():
                req.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is waiting
            req.loop.call_soon_threadsafe(deliver)

    # ---- the worker ---------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._stopping or self._queue or self._running or self._updates):
                        self._cond.wait()
                    if self._stopping:
                        return
                self._step()

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
        if self._running:
            self._decode()
            self._retire()

    def _apply_updates(self) -> None:
        with self._cond:
            updates = list(self._updates)
            self._updates.clear()
        for state, version, done, loop in updates:
            try:
                check_version(self._version, version)  # a later push may have overtaken this one
                with torch.inference_mode():
                    self.model.load_state_dict(state, strict=True)
            except Exception as exc:  # a bad state dict must fail its caller, not the engine
                loop.call_soon_threadsafe(_set_exception, done, exc)
                continue
            self._version = version
            self.stats.weight_updates += 1
            for req in self._running:
                req.cached = 0  # rebuilt from the full token sequence with the new weights
            with self._cond:
                self._sessions.clear()
                self._session_total = 0
            loop.call_soon_threadsafe(_set_result, done, self._version)

    def _drop_cancelled(self) -> None:
        with self._cond:
            self._queue = deque(r for r in self._queue if not r.cancelled)
        for i in reversed(range(len(self._running))):
            if self._running[i].cancelled:
                self._remove(i)

    def _admit(self) -> None:
        admitted: list[_Request] = []
        budget = 4 * self.prefill_tokens
        with self._cond:
            while self._queue and len(self._running) + len(admitted) < self.max_batch and budget > 0:
                req = self._queue.popleft()
                self._attach_session(req)
                budget -= len(req.tokens) - req.cached
                admitted.append(req)
        if not admitted:
            return
        # Similar lengths side by side: less padding in the prefill chunks.
        admitted.sort(key=lambda r: len(r.tokens) - r.cached)
        self._ensure_rows(len(self._running) + len(admitted))
        for req in admitted:
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
        self._session_total -= len(kept.tokens)
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

    def _grow(self, rows: int, capacity: int) -> None:
        old, self._cache = self._cache, self._allocate(rows, capacity)
        self._cache[:, :, : old.shape[2], :, : old.shape[4]] = old

    def _ensure_rows(self, rows: int) -> None:
        have = self._cache.shape[2]
        if have < rows:
            self._grow(max(rows, min(self.max_batch, 2 * have)), self._cache.shape[4])

    def _ensure_capacity(self, length: int) -> None:
        have = self._cache.shape[4]
        if have < length:
            self._grow(self._cache.shape[2], min(self.max_len, max(length, 2 * have)))

    def _views(self, a: int, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache = self._cache
        return [(cache[layer, 0, a:b], cache[layer, 1, a:b]) for layer in range(self.cfg.num_hidden_layers)]

    # ---- forward passes -----------------------------------------------------------------------

    def _prefill(self, first: int) -> None:
        """Encode every row from `first` on that has uncached tokens; sample their next token."""
        rows = list(range(first, len(self._running)))
        start = 0
        while start < len(rows):
            end, width = start, 0
            while end < len(rows):
                r = self._running[rows[end]]
                w = max(width, len(r.tokens) - r.cached)
                if end > start and w * (end - start + 1) > self.prefill_tokens:
                    break
                width, end = w, end + 1
            self._prefill_chunk(rows[start], rows[end - 1] + 1, width)
            start = end

    def _prefill_chunk(self, a: int, b: int, width: int) -> None:
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
        self._sample_rows(reqs, logits)

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
        temperature = torch.tensor([r.params.temperature for r in reqs], device=logits.device)
        top_p = torch.tensor([r.params.top_p for r in reqs], device=logits.device)
        uniforms = torch.rand(len(reqs), generator=self._generator)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                uniforms[i] = torch.rand(1, generator=r.generator)
        tokens, logps = sample(logits, temperature, top_p, uniforms.to(logits.device))
        for r, tok, lp in zip(reqs, tokens.tolist(), logps.tolist(), strict=True):
            r.tokens.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self._version)
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
                continue
            if req.session_id is not None:
                self._keep_session(req, i)
            self.stats.finished += 1
            self._resolve(req, reason)
            self._remove(i)

    def _keep_session(self, req: _Request, row: int) -> None:
        n = req.cached  # the last sampled token was never fed, so it has no keys/values yet
        kv = self._cache[:, :, row, :, :n].clone()
        with self._cond:
            self._sessions[req.session_id] = _Session(tokens=req.tokens[:n], kv=kv)
            self._session_total += n
            while self._session_total > self.session_tokens and self._sessions:
                _, old = self._sessions.popitem(last=False)
                self._session_total -= len(old.tokens)

    def _remove(self, row: int) -> None:
        """Free `row`; the last running row moves into it so rows stay contiguous."""
        last = len(self._running) - 1
        if row != last:
            moved = self._running[last]
            n = moved.cached
            self._cache[:, :, row, :, :n] = self._cache[:, :, last, :, :n]
            self._running[row] = moved
        self._running.pop()


def _set_result(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
