"""`agentrl serve` stops with a clear message and a distinct status once its engine reports itself dead."""

from __future__ import annotations

import threading
import time

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl.serving import supervise
from agentrl.serving.process import free_port


class DyingEngine:
    """Stands in for an engine whose core dies while serving (the vLLM test kills a real one)."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def health(self) -> str | None:
        return self.reason


def test_server_answers_until_the_engine_dies_then_exits_with_engine_dead_status(capfd, monkeypatch):
    monkeypatch.setattr(supervise, "POLL_S", 0.05)
    engine = DyingEngine()

    async def health(request):
        reason = engine.health()
        return JSONResponse({"reason": reason}, 503 if reason else 200)

    app = Starlette(routes=[Route("/health", health)])
    port = free_port()
    status: list[int] = []
    thread = threading.Thread(
        target=lambda: status.append(
            supervise.serve_until_unhealthy(app, engine, host="127.0.0.1", port=port, grace_s=3.0)
        )
    )
    thread.start()
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            assert httpx.get(url).status_code == 200
            break
        except httpx.TransportError:
            time.sleep(0.05)
    engine.reason = "vLLM engine core died (engine-core process killed by signal 9)"
    assert httpx.get(url).status_code == 503  # during the grace period: a 503 with the reason
    thread.join(20)
    assert status == [supervise.EXIT_ENGINE_DEAD]
    err = capfd.readouterr().err
    assert "vLLM engine core died (engine-core process killed by signal 9)" in err
    assert "exiting with status 3 so a supervisor can restart the server" in err
