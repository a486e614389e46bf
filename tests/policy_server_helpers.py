"""Run the real policy server (uvicorn) on a free loopback port inside a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from agentrl.serving.engine_api import Engine
from agentrl.serving.process import free_port
from agentrl.serving.server import create_app
from agentrl.tokenizer import ChatTokenizer


@contextlib.asynccontextmanager
async def running_server(engine: Engine, tokenizer: ChatTokenizer, name: str = "tiny") -> AsyncIterator[str]:
    async with serve_app(create_app(engine, tokenizer, name)) as url:
        yield url


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port; yield its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
