"""A minimal text browser over one pooled `httpx.AsyncClient` per event loop.

All envs on a loop share one client (one connection pool to each server), which is what lets
hundreds of episodes browse concurrently without opening hundreds of pools. Sessions live in
URLs, not cookies, so sharing the client's cookie jar is harmless.

Requests go through `fetch`, which admits at most `MAX_IN_FLIGHT` at a time per loop: httpcore's
pool scans every queued request and every connection each time one is assigned, so letting 256
episodes queue on it directly costs quadratic time. Measured on this project's 2-core machine
(256 shop expert episodes, shared in-process server): 256 connections ungated 7 episodes/s; gate
32: 16/s; gate 8: 23/s. One app server answers one request at a time anyway.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from agentrl_web.render import Form, Page, render

MAX_IN_FLIGHT = 8


@dataclass
class _LoopClient:
    client: httpx.AsyncClient
    gate: asyncio.Semaphore


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = weakref.WeakKeyDictionary()


def _loop_client() -> _LoopClient:
    loop = asyncio.get_running_loop()
    shared = _per_loop.get(loop)
    if shared is None or shared.client.is_closed:
        client = httpx.AsyncClient(
            follow_redirects=True,
            timeout=httpx.Timeout(30.0, pool=None),  # waiting for a pooled connection is not an error
            limits=httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT),
        )
        shared = _per_loop[loop] = _LoopClient(client, asyncio.Semaphore(MAX_IN_FLIGHT))
    return shared


def http_client() -> httpx.AsyncClient:
    """The running loop's shared client (created on first use)."""
    return _loop_client().client


async def fetch(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request on the loop's shared client, waiting for a free slot first."""
    shared = _loop_client()
    async with shared.gate:
        return await shared.client.request(method, url, **kwargs)


class Browser:
    """The current page and the history of one episode."""

    def __init__(self, max_history: int = 50) -> None:
        self.page: Page | None = None
        self.history: list[str] = []
        self._max_history = max_history

    async def goto(self, url: str) -> Page:
        return await self._load(fetch("GET", url))

    async def submit(self, form: Form, fields: dict[str, str]) -> Page:
        data = {**form.fields, **fields}
        if form.method == "post":
            return await self._load(fetch("POST", form.action, data=data))
        separator = "&" if "?" in form.action else "?"
        return await self._load(fetch("GET", form.action + separator + urlencode(data)))

    async def back(self) -> Page | None:
        """Reload the previous page; None when there is none."""
        if len(self.history) < 2:
            return None
        self.history.pop()
        previous = self.history.pop()
        return await self.goto(previous)

    async def _load(self, request: Awaitable[httpx.Response]) -> Page:
        response = await request
        self.page = render(response.text, str(response.url), response.status_code)
        self.history.append(self.page.url)
        del self.history[: -self._max_history]
        return self.page
