"""`PolicyClient`: the EnvManager's LLM policy, talking to the policy server's token route.

Token-in/token-out. Per episode the client keeps a `TokenLedger` (agentrl/rollout/ledger.py: the
one definition of an episode's token layout, shared with SFT): each turn it appends only the new
messages' tokens and sends the whole prefix with the episode id as `session_id`, so the server
re-encodes only the new tokens. History is never re-tokenized.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from pathlib import Path
from typing import Any

import httpx

from agentrl.errors import PolicyError
from agentrl.generation import SamplingParams
from agentrl.rollout.http_pool import ShardedAsyncClient
from agentrl.rollout.ledger import TokenLedger
from agentrl.rollout.protocol import PolicyInput, PolicyOutput
from agentrl.tokenizer import ChatTokenizer
from agentrl.tools import forced_prefix

RETRY_STATUS = {429, 502, 503, 504}
MAX_BACKOFF = 2.0  # seconds between retries when retrying for a time budget
RELEASE_TIMEOUT = 2.0  # seconds for a best-effort session release
RELEASE_DELAY = 0.05  # seconds to gather ended episodes into one release (a group ends together)
logger = logging.getLogger(__name__)


class PolicyClient:
    """An async `Policy` (and `EpisodeAwarePolicy`) backed by a policy server."""

    def __init__(
        self,
        base_url: str,
        tokenizer: str | Path | ChatTokenizer,
        *,
        sampling: SamplingParams | None = None,
        timeout: float = 600.0,
        max_retries: int = 6,
        backoff: float = 0.1,
        max_connections: int = 1024,
        seed: int | None = None,
        retry_for: float | None = None,
        api_key: str | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> None:
        """`seed`: if set, every request's sampling seed is drawn from (seed, the episode's task
        seed, its index in the group, the turn), so replaying the same episodes samples the same
        tokens whatever else shares the server's batches: evaluations at temperature > 0 become
        repeatable, and two checkpoints are compared on common random numbers. None (training)
        leaves sampling to the server's shared generator.

        `retry_for`: if set, connection errors and 429/5xx-unavailable answers are retried (backoff
        capped at 2 s) for up to this many seconds instead of `max_retries` times, so a policy
        server that dies and is restarted (the trainer does that) costs the turns in flight a
        re-sample, not the episode. A turn re-sent this way is sampled whole again: the ledger
        records a turn only once its answer arrives, so the episode's tokens stay exact.

        `api_key`: sent as `Authorization: Bearer KEY` (a server started with `--api-key`).

        `tool_choice` ("required" or {"type": "function", "function": {"name": N}}) forces every
        turn of a tool env to open with a call, as the server's chat route does; the forced text
        is sent as prompt tokens and is part of the action text. None/"auto": the model decides.
        """
        self.seed = seed
        self.tool_choice = tool_choice
        self.tokenizer = tokenizer if isinstance(tokenizer, ChatTokenizer) else ChatTokenizer(tokenizer)
        self.sampling = sampling or SamplingParams()
        self.max_retries, self.backoff, self.retry_for = max_retries, backoff, retry_for
        self.resent_requests = 0  # requests sent again after a connection error or a 429/503
        self.http = ShardedAsyncClient(base_url, timeout=timeout, max_connections=max_connections)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._episodes: dict[str, TokenLedger] = {}
        self._ended: list[str] = []  # episodes whose server sessions are not released yet
        self._releaser: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._releaser is not None:
            await asyncio.wait({self._releaser}, timeout=RELEASE_DELAY + RELEASE_TIMEOUT)
            self._releaser.cancel()
            await asyncio.gather(self._releaser, return_exceptions=True)
        await self.http.aclose()

    # ---- HTTP with retries ---------------------------------------------------------------------

    async def request(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """Send with retries (exponential backoff + jitter) on connection errors, 429 and 503."""
        deadline = None if self.retry_for is None else time.monotonic() + self.retry_for
        attempt = 0
        while True:
            last = (attempt >= self.max_retries) if deadline is None else time.monotonic() >= deadline
            try:
                response = await self.http.request(method, url, headers=self.headers, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise PolicyError(f"policy server unreachable at {self.http.base_url}: {exc!r}") from exc
            else:
                if response.status_code not in RETRY_STATUS or last:
                    if response.is_error:
                        raise PolicyError(f"{method} {url} -> {response.status_code}: {response.text}")
                    body: dict[str, Any] = response.json()
                    return body
            delay = self.backoff * 2**attempt * (0.5 + random.random())
            await asyncio.sleep(delay if deadline is None else min(delay, MAX_BACKOFF))
            attempt += 1
            self.resent_requests += 1

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, session_id: str | None = None
    ) -> dict[str, Any]:
        """The raw token route: token_ids, logprobs, versions, finish_reason, cached_prompt_tokens."""
        body = {
            "prompt_token_ids": prompt_token_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": params.stop,
            "stop_token_ids": params.stop_token_ids,
            "seed": params.seed,
            "session_id": session_id,
        }
        return await self.request("POST", "/v1/generate", json=body)

    # ---- the Policy protocol -------------------------------------------------------------------

    async def __call__(self, request: PolicyInput) -> PolicyOutput:
        ledger = self._episodes.get(request.episode_id)
        if ledger is None:
            ledger = self._episodes[request.episode_id] = TokenLedger(self.tokenizer)
        messages = [dict(m) for m in request.messages]
        forced = forced_prefix(self.tool_choice, request.tools) if request.tools else ""
        prompt = ledger.next_prompt(messages, tools=request.tools, forced=forced)
        params = self.sampling
        if self.seed is not None and request.seed is not None:
            key = hash((self.seed, request.seed, request.index, request.turn))  # ints: stable across runs
            params = dataclasses.replace(params, seed=key & (2**63 - 1))
        out = await self.generate(ledger.tokens + prompt, params, session_id=request.episode_id)
        sampled: list[int] = out["token_ids"]
        ledger.record(prompt, sampled, messages_seen=len(messages))
        return PolicyOutput(
            text=forced + self.tokenizer.decode(sampled, skip_special_tokens=True),
            prompt_token_ids=prompt,
            token_ids=sampled,
            logprobs=out["logprobs"],
            versions=out["versions"],
            finish_reason=out["finish_reason"],
        )

    async def end_episode(self, episode_id: str) -> None:
        """Forget the episode here, and release its kept KV prefix on the server in the background.

        Releases are batched: the episodes that end within `RELEASE_DELAY` of each other (a group
        ends together) go in one request, so ending an episode costs no request of its own. They
        are best effort and never awaited by the episode: the server's session store is
        LRU-bounded, so a release that cannot be sent (server gone, or a shutdown that just
        cancelled hundreds of in-flight requests) costs cache space there until eviction, never
        correctness. `aclose` waits for the last one.
        """
        if self._episodes.pop(episode_id, None) is None:
            return
        self._ended.append(episode_id)
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.create_task(self._release_sessions())

    async def _release_sessions(self) -> None:
        while self._ended:
            await asyncio.sleep(RELEASE_DELAY)
            ids, self._ended = self._ended, []
            try:
                async with asyncio.timeout(RELEASE_TIMEOUT):
                    await self.http.post(
                        "/v1/sessions/release", json={"session_ids": ids}, headers=self.headers
                    )
            except (httpx.HTTPError, TimeoutError) as exc:
                logger.debug("%d sessions not released on the server: %r", len(ids), exc)

    def episode_tokens(self, episode_id: str) -> list[int]:
        """Every token of the episode so far, in order (prompts and samples)."""
        return list(self._episodes[episode_id].tokens)
