"""Run the policy server until it is stopped or its engine can no longer serve.

An engine whose core died (vLLM's engine-core process killed, out of memory) cannot recover
in-process in any useful time, and a server that keeps answering would only turn every request
into an error. So `agentrl serve` watches `engine.health()`: once it reports a reason, the
server keeps answering 503 with that reason for a short grace period (so clients and health
checks see why rather than a reset connection), then shuts down cleanly and exits with
`EXIT_ENGINE_DEAD`, and a supervisor (the trainer's `ServerProcess`, systemd, Kubernetes)
restarts it from the newest checkpoint with `--policy-version`.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn

from agentrl.serving.engine_api import Engine

EXIT_ENGINE_DEAD = 3
POLL_S = 0.5
GRACE_S = 3.0


def serve_until_unhealthy(app: Any, engine: Engine, *, host: str, port: int, grace_s: float = GRACE_S) -> int:
    """Serve `app` with uvicorn; return 0 after a normal stop, `EXIT_ENGINE_DEAD` if the engine died."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))

    async def main() -> int:
        watcher = asyncio.create_task(_stop_when_unhealthy(engine, server, grace_s))
        try:
            await server.serve()
        finally:
            watcher.cancel()
        died = watcher.done() and not watcher.cancelled() and watcher.exception() is None
        return EXIT_ENGINE_DEAD if died else 0

    return asyncio.run(main())


async def _stop_when_unhealthy(engine: Engine, server: uvicorn.Server, grace_s: float) -> None:
    """Return (after stopping the server) once the engine reports itself unable to serve."""
    while (reason := engine.health()) is None:
        await asyncio.sleep(POLL_S)
    print(
        f"agentrl serve: {reason}. Answering 503 for {grace_s:g}s, then exiting with status "
        f"{EXIT_ENGINE_DEAD} so a supervisor can restart the server (from the newest checkpoint, "
        "with --policy-version).",
        file=sys.stderr,
        flush=True,
    )
    await asyncio.sleep(grace_s)
    server.should_exit = True
