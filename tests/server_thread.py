"""A real policy server (uvicorn + an engine) on its own event loop in a background thread.

For tests whose client side is synchronous (hypothesis, the `openai` sync client) or that want
one server for a whole module: the server's loop never shares the test's loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from agentrl.serving.process import free_port


@contextmanager
def server_in_thread(app: Any) -> Iterator[str]:
    """Serve `app` on a free loopback port from a daemon thread; yield its base URL."""
    port = free_port()
    # A long keep-alive: on a loaded machine an idle gap over uvicorn's 5 s default races the
    # client reusing the connection (a spurious ReadError that says nothing about the server).
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=120)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server did not start")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
