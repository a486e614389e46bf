"""Bounded per-episode session storage shared by the web apps.

Hundreds of envs browse one server at once; each episode gets its own session (an id in the
URL path), so carts and selections never leak between episodes. An env that crashes never
deletes its session, so the store bounds itself: sessions idle for longer than `ttl` seconds
expire, and past `max_sessions` the least recently used one is evicted.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

S = TypeVar("S")


class SessionStore(Generic[S]):
    """An LRU map from session id to per-session state, with idle expiry."""

    def __init__(self, factory: Callable[[], S], *, max_sessions: int = 4096, ttl: float = 1800.0) -> None:
        if max_sessions < 1 or ttl <= 0:
            raise ValueError("max_sessions must be >= 1 and ttl > 0")
        self._factory = factory
        self._max = max_sessions
        self._ttl = ttl
        self._items: OrderedDict[str, tuple[float, S]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def create(self) -> str:
        """Start a new session and return its id (unguessable, URL-safe)."""
        self._expire()
        sid = secrets.token_urlsafe(12)
        self._items[sid] = (time.monotonic(), self._factory())
        while len(self._items) > self._max:
            self._items.popitem(last=False)
        return sid

    def get(self, sid: str) -> S | None:
        """The live state of `sid` (refreshing its idle timer), or None if unknown or expired."""
        entry = self._items.get(sid)
        if entry is None:
            return None
        now = time.monotonic()
        if now - entry[0] > self._ttl:
            del self._items[sid]
            return None
        self._items[sid] = (now, entry[1])
        self._items.move_to_end(sid)
        return entry[1]

    def delete(self, sid: str) -> bool:
        return self._items.pop(sid, None) is not None

    def _expire(self) -> None:
        """Drop idle sessions from the old end; the dict is ordered by last use."""
        now = time.monotonic()
        while self._items:
            sid, (last_used, _) = next(iter(self._items.items()))
            if now - last_used <= self._ttl:
                break
            del self._items[sid]
