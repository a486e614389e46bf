"""Serving the apps: one shared server per app per process, started lazily, or standalone.

`shared_server("shop")` starts uvicorn in a daemon thread with its own event loop the first
time any env of the process needs it, waits until it answers, and returns its base URL; later
calls return the same URL. The server lives until the process exits, so envs that come and go
(or crash mid-episode) never restart it. Envs given a `base_url` skip this and browse a server
started elsewhere (`python -m agentrl_web.serve shop --port 8001`).
"""

from __future__ import annotations

import asyncio
import atexit
import socket
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn
from agentrl_web.shop.app import create_app as create_shop_app
from agentrl_web.wiki.app import create_app as create_wiki_app
from starlette.applications import Starlette

from agentrl.errors import AgentRLError

APPS: dict[str, Callable[[int], Starlette]] = {"shop": create_shop_app, "wiki": create_wiki_app}


class WebServerError(AgentRLError):
    """An app server could not be started or did not answer."""


class AppServer:
    """One app served by uvicorn on 127.0.0.1 from a background thread."""

    def __init__(self, app: str, seed: int = 0, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if app not in APPS:
            raise WebServerError(f"Unknown app {app!r}; known apps: {', '.join(APPS)}")
        self.app_name = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this: without it Nagle's algorithm meets the client's delayed
        # ACK and every response waits ~40 ms.
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.bind((host, port))  # bound here, so the port is known before uvicorn starts
        self.base_url = f"http://{host}:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(
            APPS[app](seed), log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=60
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"agentrl-web-{app}", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self, timeout: float = 30.0) -> str:
        """Start serving and block until the server answers `/api/info`; returns the base URL."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise WebServerError(f"The {self.app_name} server thread exited during startup")
            if self._server.started:
                try:
                    httpx.get(self.base_url + "/api/info", timeout=5).raise_for_status()
                    return self.base_url
                except httpx.HTTPError:
                    pass
            time.sleep(0.02)
        raise WebServerError(f"The {self.app_name} server did not answer within {timeout:.0f} s")

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)


_shared: dict[tuple[str, int], AppServer] = {}
_lock = threading.Lock()


def shared_server(app: str, seed: int = 0) -> str:
    """The base URL of this process's server for `app` built from `seed`, starting it if needed."""
    with _lock:
        server = _shared.get((app, seed))
        if server is None:
            server = AppServer(app, seed)
            server.start()
            _shared[(app, seed)] = server
        return server.base_url


@atexit.register
def _stop_shared() -> None:
    for server in _shared.values():
        server.stop()
