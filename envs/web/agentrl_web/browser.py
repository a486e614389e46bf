"""A minimal text browser over one pooled `httpx.AsyncClient` per event loop.

All envs on a loop share one client (one connection pool to each server), which is what lets
hundreds of episodes browse concurrently without opening hundreds of pools. Sessions live in
URLs, not cookies, so sharing the client's cookie jar is harmless.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from urllib.parse import urlencode

import httpx
from agentrl_web.render import Form, Page, render

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def http_client() -> httpx.AsyncClient:
    """The running loop's shared client (created on first use)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            follow_redirects=True,
            timeout=httpx.Timeout(30.0, pool=None),  # waiting for a pooled connection is not an error
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        _clients[loop] = client
    return client


class Browser:
    """The current page and the history of one episode."""

    def __init__(self, max_history: int = 50) -> None:
        self.page: Page | None = None
        self.history: list[str] = []
        self._max_history = max_history

    async def goto(self, url: str) -> Page:
        return await self._load(http_client().get(url))

    async def submit(self, form: Form, fields: dict[str, str]) -> Page:
        data = {**form.fields, **fields}
        if form.method == "post":
            return await self._load(http_client().post(form.action, data=data))
        separator = "&" if "?" in form.action else "?"
        return await self._load(http_client().get(form.action + separator + urlencode(data)))

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
