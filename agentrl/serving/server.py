"""The policy server: OpenAI-compatible routes plus a token route, over any `Engine`.

Routes
  GET  /health                 liveness and the current policy version
  GET  /metrics                JSON counters: requests, tokens/s, queue depth, version, cache hits
  GET  /v1/models              the one served model
  POST /v1/chat/completions    OpenAI chat (logprobs / top_logprobs=0 supported; n=1)
  POST /v1/completions         OpenAI completions (prompt text or token ids; logprobs supported)
  POST /v1/generate            token route: prompt_token_ids (+ session_id) -> token_ids, logprobs,
                               versions, finish_reason (what the training client uses)
  DELETE /v1/sessions/{id}     forget a session's kept KV prefix (episode over)
  POST /v1/sessions/release    {"session_ids": [...]}: the same for many sessions in one request
  POST /v1/weights/load        {"path": checkpoint dir} -> {"version": new}
  POST /v1/weights/state_dict  body = safetensors bytes -> {"version": new}

Errors are OpenAI-shaped (`{"error": {"message", "type", "param"}}`): 400 for malformed JSON or
fields (pydantic's message names the field), 429 when the engine's bounded queue is full, 503
while the server is shutting down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, is_dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrl.errors import PolicyError
from agentrl.generation import POLICY_VERSION_HEADER, GenerationResult, SamplingParams
from agentrl.serving.engine_api import Engine, EngineDead, EngineOverloaded, InvalidRequest, StaleVersion
from agentrl.tokenizer import ChatTokenizer

# ---- request bodies ---------------------------------------------------------------------------


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="only n=1: send n requests to sample n times")

    def sampling(self, default_max: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or default_max,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids),
            seed=self.seed,
        )


class GenerateBody(_Sampling):
    prompt_token_ids: list[int] = Field(min_length=1)
    session_id: str | None = None


class ChatMessageBody(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatBody(_Sampling):
    model: str | None = None
    messages: list[ChatMessageBody] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0, description="alternatives are not returned")


class CompletionBody(_Sampling):
    model: str | None = None
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=0, description="only the sampled token's logprob")
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo=true is not supported")
        return v


class WeightsPathBody(BaseModel):
    path: str
    version: int = Field(ge=0)  # the trainer's version for these weights (required: it owns the count)


class ReleaseBody(BaseModel):
    session_ids: list[str]


# ---- the app ----------------------------------------------------------------------------------


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


class _Metrics:
    def __init__(self) -> None:
        self.started = time.time()
        self.requests: dict[str, int] = {}
        self.rejected_overload = 0
        self.bad_requests = 0
        self.generated_tokens = 0
        self.window: list[tuple[float, int]] = []  # (time, tokens) of recent results, for tokens/s

    def record(self, route: str, result: GenerationResult | None = None) -> None:
        self.requests[route] = self.requests.get(route, 0) + 1
        if result is not None:
            now = time.time()
            self.generated_tokens += len(result.token_ids)
            self.window.append((now, len(result.token_ids)))
            self.window = [(t, n) for t, n in self.window if now - t <= 10.0]

    def tokens_per_s(self) -> float:
        now = time.time()
        recent = sum(n for t, n in self.window if now - t <= 10.0)
        return recent / min(10.0, max(now - self.started, 1e-6))


def create_app(
    engine: Engine, tokenizer: ChatTokenizer, model_name: str, *, manage_engine: bool = True
) -> Starlette:
    """The ASGI app. With `manage_engine`, the app's lifespan starts and stops the engine."""
    metrics = _Metrics()
    default_max = 256

    async def parse(request: Request, model: type[BaseModel]) -> BaseModel | JSONResponse:
        try:
            raw = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            metrics.bad_requests += 1
            return _error(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            metrics.bad_requests += 1
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return _error(400, f"{where}: {first['msg']}", "invalid_request_error", where)

    async def run(
        request: Request, route: str, prompt: list[int], params: SamplingParams, session_id: str | None = None
    ):
        try:
            work = engine.generate(prompt, params, session_id=session_id)
            result = await _unless_disconnected(request, work)
        except EngineOverloaded as exc:
            metrics.rejected_overload += 1
            return _error(429, str(exc), "overloaded")
        except InvalidRequest as exc:
            metrics.bad_requests += 1
            return _error(400, str(exc), "invalid_request_error")
        except PolicyError as exc:  # engine dead, not running (starting up or shutting down)
            return _error(503, str(exc), "unavailable")
        if result is None:
            return _error(499, "client disconnected", "cancelled")
        metrics.record(route, result)
        return result

    async def health(request: Request) -> JSONResponse:
        reason = engine.health() if hasattr(engine, "health") else None
        if reason is not None:
            return JSONResponse({"status": "failed", "reason": reason, "version": engine.version}, 503)
        return JSONResponse({"status": "ok", "version": engine.version, "model": model_name})

    async def metrics_route(request: Request) -> JSONResponse:
        stats = getattr(engine, "stats", None)
        body: dict[str, Any] = {
            "version": engine.version,
            "uptime_s": round(time.time() - metrics.started, 3),
            "requests": metrics.requests,
            "rejected_overload": metrics.rejected_overload,
            "bad_requests": metrics.bad_requests,
            "generated_tokens": metrics.generated_tokens,
            "tokens_per_s": round(metrics.tokens_per_s(), 2),
            "queue_depth": getattr(engine, "queue_depth", None),
            "running": getattr(engine, "running", None),
            "engine": asdict(stats) if is_dataclass(stats) and not isinstance(stats, type) else None,
        }
        return JSONResponse(body)

    async def models(request: Request) -> JSONResponse:
        card = {"id": model_name, "object": "model", "created": int(metrics.started), "owned_by": "agentrl"}
        return JSONResponse({"object": "list", "data": [card | {"version": engine.version}]})

    async def generate(request: Request) -> JSONResponse:
        body = await parse(request, GenerateBody)
        if isinstance(body, JSONResponse):
            return body
        assert isinstance(body, GenerateBody)
        params = body.sampling(default_max)
        result = await run(request, "generate", body.prompt_token_ids, params, body.session_id)
        if isinstance(result, JSONResponse):
            return result
        return JSONResponse(asdict(result) | {"version": engine.version})

    def drop_sessions(session_ids: list[str]) -> None:
        drop = getattr(engine, "drop_session", None)  # engines without a session store ignore it
        if drop is not None:
            for session_id in session_ids:
                drop(session_id)

    async def end_session(request: Request) -> JSONResponse:
        drop_sessions([request.path_params["session_id"]])
        return JSONResponse({"ok": True})

    async def release_sessions(request: Request) -> JSONResponse:
        body = await parse(request, ReleaseBody)
        if isinstance(body, JSONResponse):
            return body
        assert isinstance(body, ReleaseBody)
        drop_sessions(body.session_ids)
        return JSONResponse({"ok": True})

    def usage(result: GenerationResult) -> dict[str, int]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(result.token_ids),
            "total_tokens": result.prompt_tokens + len(result.token_ids),
        }

    def visible(ids: list[int]) -> list[int]:
        """Drop the end-of-turn / EOS token from the text shown to an OpenAI client."""
        eos = set(tokenizer.eos_token_ids)
        return ids[:-1] if ids and ids[-1] in eos else ids

    async def chat(request: Request) -> JSONResponse:
        body = await parse(request, ChatBody)
        if isinstance(body, JSONResponse):
            return body
        assert isinstance(body, ChatBody)
        prompt = tokenizer.encode_chat([m.model_dump() for m in body.messages], add_generation_prompt=True)
        params = body.sampling(default_max)
        if body.max_completion_tokens:
            params.max_tokens = body.max_completion_tokens
        result = await run(request, "chat.completions", prompt, params)
        if isinstance(result, JSONResponse):
            return result
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": tokenizer.decode(visible(result.token_ids))},
            "finish_reason": result.finish_reason,
            "logprobs": None,
        }
        if body.logprobs:
            content = []
            for tok, lp in zip(result.token_ids, result.logprobs, strict=True):
                piece = tokenizer.decode([tok])
                entry = {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
                content.append(entry)
            choice["logprobs"] = {"content": content}
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": usage(result),
            "system_fingerprint": f"policy-v{result.versions[-1] if result.versions else engine.version}",
        })

    async def completions(request: Request) -> JSONResponse:
        body = await parse(request, CompletionBody)
        if isinstance(body, JSONResponse):
            return body
        assert isinstance(body, CompletionBody)
        prompt = body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt)
        result = await run(request, "completions", prompt, body.sampling(16))
        if isinstance(result, JSONResponse):
            return result
        choice: dict[str, Any] = {
            "index": 0,
            "text": tokenizer.decode(result.token_ids),
            "finish_reason": result.finish_reason,
            "logprobs": None,
        }
        if body.logprobs is not None:
            pieces = [tokenizer.decode([t]) for t in result.token_ids]
            offsets, pos = [], 0
            for p in pieces:
                offsets.append(pos)
                pos += len(p)
            choice["logprobs"] = {
                "tokens": pieces,
                "token_logprobs": result.logprobs,
                "top_logprobs": None,
                "text_offset": offsets,
            }
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": usage(result),
        })

    async def load_weights(request: Request) -> JSONResponse:
        body = await parse(request, WeightsPathBody)
        if isinstance(body, JSONResponse):
            return body
        assert isinstance(body, WeightsPathBody)
        return await _update(body.path, body.version)

    async def state_dict_weights(request: Request) -> JSONResponse:
        from safetensors.torch import load as load_safetensors

        header = request.headers.get(POLICY_VERSION_HEADER, "")
        if not header.isdigit():
            message = f"the {POLICY_VERSION_HEADER} header must give the weights' version as an integer >= 0"
            return _error(400, message, "invalid_request_error")
        raw = await request.body()
        try:
            state = load_safetensors(raw)
        except Exception as exc:  # safetensors raises its own error types for bad headers
            return _error(400, f"body is not a safetensors file: {exc}", "invalid_request_error")
        return await _update(state, int(header))

    async def _update(source: Any, version: int) -> JSONResponse:
        try:
            version = await engine.update_weights(source, version)
        except StaleVersion as exc:
            return _error(409, str(exc), "invalid_request_error")
        except EngineDead as exc:
            return _error(503, str(exc), "unavailable")
        except PolicyError as exc:
            return _error(400, str(exc), "invalid_request_error")
        except FileNotFoundError as exc:
            return _error(400, f"no checkpoint at {exc.filename}", "invalid_request_error")
        metrics.record("weights")
        return JSONResponse({"version": version})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        yield
        if manage_engine:
            await engine.stop()

    routes: list[tuple[str, Callable, list[str]]] = [
        ("/health", health, ["GET"]),
        ("/metrics", metrics_route, ["GET"]),
        ("/v1/models", models, ["GET"]),
        ("/v1/generate", generate, ["POST"]),
        ("/v1/sessions/release", release_sessions, ["POST"]),
        ("/v1/sessions/{session_id}", end_session, ["DELETE"]),
        ("/v1/chat/completions", chat, ["POST"]),
        ("/v1/completions", completions, ["POST"]),
        ("/v1/weights/load", load_weights, ["POST"]),
        ("/v1/weights/state_dict", state_dict_weights, ["POST"]),
    ]
    return Starlette(routes=[Route(p, f, methods=m) for p, f, m in routes], lifespan=lifespan)


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Await `work`, cancelling it (the engine frees its slot) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()
