"""The policy server: OpenAI-compatible routes plus a token route, over any `Engine`.

Routes (access: G = generation key, A = admin key, - = open; see docs/serving.md)
  GET  /health                 - 200 {"status": "ok", version} or 503 with the engine's reason
  GET  /metrics                - JSON counters: requests, tokens/s, running, queued, cancelled, KV bytes
  GET  /openapi.json           - the request schemas (generated from `schemas.py`)
  GET  /v1/models[/{id}]       G the one served model
  POST /v1/chat/completions    G OpenAI chat: stream, n, logprobs, top_logprobs, stop, seed
  POST /v1/completions         G OpenAI completions: prompt lists, token-id prompts, echo, stream
  POST /v1/generate            G token route: prompt_token_ids (+ session_id) -> token_ids, logprobs,
                                 versions, finish_reason (what the training client uses)
  DELETE /v1/sessions/{id}     G/A forget a session's kept KV prefix (episode over)
  POST /v1/sessions/release    G/A {"session_ids": [...]}: the same for many sessions
  POST /v1/weights/load        A {"path": checkpoint dir, "version": N} -> {"version": N}
  POST /v1/weights/state_dict  A safetensors body, header X-Policy-Version: N -> {"version": N}

How it is put together. Handlers are module-level functions reading `request.app.state.ctx`
(a `ServerContext`). Every body goes through one helper (`parse_body`: size limit, JSON, lone
surrogates, pydantic model), run in a worker thread with tokenization and response decoding so a
1 MB prompt never stalls the event loop. Every failure becomes an `ApiError`, and one function
(`error_response`) writes every error status (400 ... 503, the router's 404/405 included) as an
OpenAI error body `{"error": {"message", "type", "param", "code"}}`; nothing escapes as a 500
that would reset the connection. A client that disconnects cancels its generation, which frees
its engine slot at the next decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentrl.errors import AgentRLError, PolicyError
from agentrl.generation import POLICY_VERSION_HEADER, GenerationResult, SamplingParams
from agentrl.serving import schemas
from agentrl.serving.engine_api import (
    Engine,
    EngineDead,
    EngineOverloaded,
    GenerationChunk,
    InvalidRequest,
    StaleVersion,
    check_version,
)
from agentrl.serving.openai_format import VisibleText, chat_logprobs, completion_logprobs, usage
from agentrl.serving.openapi import openapi_document
from agentrl.serving.tools import ChatPlan, plan_chat
from agentrl.tokenizer import ChatTokenizer

logger = logging.getLogger(__name__)
Body = TypeVar("Body", bound=BaseModel)


# ---- configuration and state ------------------------------------------------------------------


@dataclass
class ServerConfig:
    """Limits and keys. `None` keys leave the routes open (fine on loopback, see `bind_warning`)."""

    api_key: str | None = None  # Bearer key of the generation (and session) routes
    admin_key: str | None = None  # Bearer key of the weight and session routes
    max_body_bytes: int = 16 << 20  # JSON bodies; larger -> 413
    max_weights_bytes: int = 64 << 30  # safetensors bodies of /v1/weights/state_dict
    chat_max_tokens: int = 256  # default max_tokens of chat (OpenAI: the rest of the context)
    completion_max_tokens: int = 16  # default max_tokens of completions (as OpenAI)
    generate_max_tokens: int = 256  # default max_tokens of the token route
    retry_after_s: int = 1  # Retry-After of a 429


@dataclass
class ServerMetrics:
    started: float = field(default_factory=time.time)
    requests: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    rejected_overload: int = 0
    bad_requests: int = 0
    disconnected: int = 0  # clients gone before their answer: generation cancelled
    generated_tokens: int = 0
    window: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens), last 10 s

    def record(self, route: str, tokens: int = 0) -> None:
        self.requests[route] = self.requests.get(route, 0) + 1
        if tokens:
            now = time.time()
            self.generated_tokens += tokens
            self.window.append((now, tokens))
            self.window = [(t, n) for t, n in self.window if now - t <= 10.0]

    def tokens_per_s(self) -> float:
        now = time.time()
        recent = sum(n for t, n in self.window if now - t <= 10.0)
        return recent / min(10.0, max(now - self.started, 1e-6))


@dataclass
class ServerContext:
    engine: Engine
    tokenizer: ChatTokenizer
    model_name: str
    config: ServerConfig
    metrics: ServerMetrics = field(default_factory=ServerMetrics)

    @property
    def end_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.eos_token_ids)


def ctx_of(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


# ---- errors -----------------------------------------------------------------------------------


class ApiError(AgentRLError):
    """An HTTP error with an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers or {}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def as_api_error(exc: BaseException, retry_after_s: int = 1) -> ApiError:
    """The one mapping from anything raised while serving a request to an HTTP error."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, StaleVersion):
        return ApiError(409, str(exc), param="version", code="stale_version")
    if isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc))
    if isinstance(exc, EngineOverloaded):
        headers = {"Retry-After": str(retry_after_s)}
        return ApiError(429, str(exc), "rate_limit_error", code="overloaded", headers=headers)
    if isinstance(exc, EngineDead):
        return ApiError(503, f"the engine is dead: {exc}", "server_error", code="engine_dead")
    if isinstance(exc, PolicyError):  # not started, shutting down
        return ApiError(503, str(exc), "server_error", code="unavailable")
    if isinstance(exc, HTTPException):  # the router's own: unknown route, wrong method
        if exc.status_code == 404:
            return ApiError(404, "no such route", "not_found_error", code="not_found")
        if exc.status_code == 405:
            headers = dict(exc.headers or {})
            return ApiError(
                405, "method not allowed on this route", code="method_not_allowed", headers=headers
            )
        return ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    logger.exception("internal error while serving a request", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}", "server_error", code="internal_error")


def error_response(exc: ApiError) -> JSONResponse:
    body = error_body(exc.message, exc.kind, exc.param, exc.code)
    return JSONResponse(body, exc.status, headers=exc.headers)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown route 404, wrong method 405) in the same OpenAI shape."""
    return error_response(as_api_error(exc))


# ---- access control ---------------------------------------------------------------------------

OPEN, GENERATE, SESSION, ADMIN = "open", "generate", "session", "admin"


def check_access(request: Request, access: str, config: ServerConfig) -> None:
    """Bearer keys per route class; state-changing admin routes also refuse browser requests."""
    if access == OPEN:
        return
    if access == GENERATE:
        wanted = [config.api_key]
    elif access == SESSION:  # the rollout client (generation key) or an operator (admin key)
        wanted = [config.api_key, config.admin_key]
    else:
        wanted = [config.admin_key or config.api_key]
    wanted = [k for k in wanted if k]
    if wanted:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")  # any header bytes, never a TypeError
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(given, k.encode()) for k in wanted):
            raise ApiError(
                401, "missing or wrong API key (send 'Authorization: Bearer KEY')", code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
    if access in (SESSION, ADMIN):
        check_same_origin(request)


def check_same_origin(request: Request) -> None:
    """A browser page on another origin must not reach the weight or session routes (CSRF)."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "")
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:  # not even a URL: certainly not this server
        netloc = None
    if netloc is None or netloc.lower() != host.lower():
        raise ApiError(
            403, f"cross-origin request from {origin!r} refused", "permission_error", code="cross_origin"
        )


def check_content_type(request: Request, allowed: tuple[str, ...], missing_ok: bool) -> None:
    kind = request.headers.get("content-type")
    if kind is None and missing_ok:
        return
    media = (kind or "").split(";", 1)[0].strip().lower()
    if media not in allowed:
        raise ApiError(
            415, f"content type {kind!r} is not accepted here; send {' or '.join(allowed)}",
            code="unsupported_media_type",
        )  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_warning(host: str, config: ServerConfig) -> str | None:
    """The loud warning for a server reachable beyond this machine with open routes, if any."""
    if is_loopback(host):
        return None
    open_routes = []
    if config.api_key is None:
        open_routes.append("generation")
    if config.admin_key is None and config.api_key is None:
        open_routes.append("weights and sessions (anyone on the network can replace the model!)")
    if not open_routes:
        return None
    return (
        f"WARNING: serving on {host} (beyond loopback) with no key on: {', '.join(open_routes)}. "
        "Set --api-key and --admin-key (or AGENTRL_API_KEY / AGENTRL_ADMIN_KEY)."
    )


# ---- bodies -----------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"body of {declared} bytes exceeds the limit of {limit}", code="request_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _find_lone_surrogate(value: Any) -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate (JSON "\\ud800"), if any.
    Iterative: a deeply nested body must not exhaust the stack here either."""
    stack: list[tuple[str, Any]] = [("body", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for k, v in item.items():
                stack.append((f"{path}.{k}", v))
                stack.append((f"{path} key", k))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(item))
    return None


def validate_json(raw: bytes, model: type[Body]) -> Body:
    """The one validation helper: bytes -> a request model, or an ApiError(400) naming the field."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    where = _find_lone_surrogate(data)
    if where is not None:
        where = where.removeprefix("body.")
        raise ApiError(400, f"{where}: string holds a lone UTF-16 surrogate (not valid Unicode)", param=where)
    try:
        return model.model_validate(data)
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unsupported parameter (not implemented by this server)"
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
            head, sep, rest = message.partition(": ")
            if sep and " " not in head:  # "field: reason" from a model validator names its field
                where, message = head, rest
        raise ApiError(400, f"{where or 'body'}: {message}", param=where) from None


async def parse_body(request: Request, model: type[Body]) -> Body:
    ctx = ctx_of(request)
    raw = await read_body(request, ctx.config.max_body_bytes)
    try:
        return await asyncio.to_thread(validate_json, raw, model)
    except ApiError:
        ctx.metrics.bad_requests += 1
        raise


def check_model(ctx: ServerContext, name: str | None) -> None:
    if name is not None and name != ctx.model_name:
        raise ApiError(
            404, f"The model `{name}` does not exist (this server serves `{ctx.model_name}`)",
            param="model", code="model_not_found",
        )  # fmt: skip


# ---- running generations ----------------------------------------------------------------------

T = TypeVar("T")


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client goes away first (its engine slot is freed)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            ctx_of(request).metrics.disconnected += 1
            raise ClientGone
    return task.result()


class ClientGone(Exception):
    """The client disconnected; there is nobody to answer."""


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def generate_all(
    ctx: ServerContext, jobs: list[tuple[list[int], SamplingParams, str | None]]
) -> list[GenerationResult]:
    """Run several generations together (n choices, several prompts); the first error cancels all."""
    tasks = [asyncio.ensure_future(ctx.engine.generate(p, s, session_id=sid)) for p, s, sid in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def open_streams(
    ctx: ServerContext, jobs: list[tuple[list[int], SamplingParams]]
) -> list[tuple[AsyncIterator[GenerationChunk], GenerationChunk]]:
    """Start every stream and wait for its first chunk, so that errors (400, 429) come back as a
    status code rather than inside a 200 event stream."""
    streams = [ctx.engine.stream(p, s) for p, s in jobs]
    firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    error = next((f for f in firsts if isinstance(f, BaseException)), None)
    if error is not None:
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()  # type: ignore[attr-defined]
        raise error
    return list(zip(streams, firsts, strict=True))  # type: ignore[arg-type]


async def merged(
    streams: list[tuple[AsyncIterator[GenerationChunk], GenerationChunk]],
) -> AsyncIterator[tuple[int, GenerationChunk]]:
    """Chunks of several streams as they come, tagged with the stream's index."""
    queue: asyncio.Queue[tuple[int, GenerationChunk | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[GenerationChunk], first: GenerationChunk) -> None:
        try:
            await queue.put((index, first))
            async for chunk in stream:
                await queue.put((index, chunk))
            await queue.put((index, None))
        except Exception as exc:
            await queue.put((index, exc))
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.create_task(pump(i, s, f)) for i, (s, f) in enumerate(streams)]
    try:
        open_count = len(tasks)
        while open_count:
            index, item = await queue.get()
            if item is None:
                open_count -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class EventStream(StreamingResponse):
    """A server-sent-event response that cancels its generator when the client disconnects."""

    def __init__(self, events: AsyncIterator[str], ctx: ServerContext) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.events, self.ctx = events, ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not sender.done():  # the client left: stop generating for nobody
            self.ctx.metrics.disconnected += 1
            sender.cancel()
        watcher.cancel()
        await asyncio.gather(sender, watcher, return_exceptions=True)

    async def _send_all(self, send: Send) -> None:
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
        except Exception as exc:  # after the 200 is sent an error can only be an event
            error = as_api_error(exc, self.ctx.config.retry_after_s)
            data = json.dumps(error_body(error.message, error.kind, error.param, error.code))
            await send(
                {"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True}
            )
        finally:
            with contextlib.suppress(Exception):
                await self.events.aclose()  # type: ignore[attr-defined]
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# ---- handlers ---------------------------------------------------------------------------------


async def health(request: Request) -> Response:
    ctx = ctx_of(request)
    reason = ctx.engine.health()
    if reason is not None:
        return JSONResponse({"status": "failed", "reason": reason, "version": ctx.engine.version}, 503)
    return JSONResponse({"status": "ok", "version": ctx.engine.version, "model": ctx.model_name})


async def metrics(request: Request) -> Response:
    ctx = ctx_of(request)
    m = ctx.metrics
    engine = ctx.engine.metrics()
    body: dict[str, Any] = {
        "version": ctx.engine.version,
        "healthy": ctx.engine.health() is None,
        "uptime_s": round(time.time() - m.started, 3),
        "requests": m.requests,
        "statuses": m.statuses,
        "rejected_overload": m.rejected_overload,
        "bad_requests": m.bad_requests,
        "disconnected": m.disconnected,
        "generated_tokens": m.generated_tokens,
        "tokens_per_s": round(m.tokens_per_s(), 2),
        "running": engine.get("running"),
        "queued": engine.get("queued"),
        "queue_depth": engine.get("queued"),  # the older name of `queued`
        "cancelled": engine.get("cancelled"),
        "kv_cache_bytes": engine.get("kv_cache_bytes"),
        "sessions": engine.get("sessions"),
        "session_bytes": engine.get("session_bytes"),
        "engine": engine,
    }
    return JSONResponse(body)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document(ctx_of(request).model_name))


def _model_card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name, "object": "model", "created": int(ctx.metrics.started), "owned_by": "agentrl",
        "version": ctx.engine.version,
    }  # fmt: skip


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(ctx_of(request))]})


async def get_model(request: Request) -> Response:
    ctx = ctx_of(request)
    check_model(ctx, request.path_params["model"])
    return JSONResponse(_model_card(ctx))


async def generate(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await parse_body(request, schemas.GenerateBody)
    params = body.sampling(body.max_tokens or ctx.config.generate_max_tokens, top_logprobs=body.top_logprobs)
    result = await until_disconnected(
        request, ctx.engine.generate(body.prompt_token_ids, params, session_id=body.session_id)
    )
    ctx.metrics.record("generate", len(result.token_ids))
    out = asdict(result) | {"version": ctx.engine.version}
    if not body.top_logprobs:
        out.pop("top_logprobs")
    return JSONResponse(out)


async def end_session(request: Request) -> Response:
    ctx_of(request).engine.drop_sessions([request.path_params["session_id"]])
    return JSONResponse({"ok": True})


async def release_sessions(request: Request) -> Response:
    check_content_type(request, ("application/json",), missing_ok=True)
    body = await parse_body(request, schemas.ReleaseBody)
    ctx_of(request).engine.drop_sessions(body.session_ids)
    return JSONResponse({"ok": True})


class _Choice:
    """What a handler needs about one choice: its prompt's index, its sampling, its text state."""

    def __init__(self, ctx: ServerContext, prompt_index: int, params: SamplingParams) -> None:
        self.prompt_index, self.params = prompt_index, params
        end_ids = ctx.end_ids | frozenset(params.stop_token_ids)
        self.text = VisibleText(ctx.tokenizer.decode, end_ids, params.stop)
        self.completion_tokens = 0
        self.finish_reason: str | None = None


def encode_text(ctx: ServerContext, text: str) -> list[int]:
    """`ChatTokenizer.encode`, through `encode_batch`, which releases the GIL while it works: from a
    worker thread, a 1 MB prompt then no longer stalls the event loop (plain `encode` holds it)."""
    return list(ctx.tokenizer.backend.encode_batch([text], add_special_tokens=False)[0].ids)


def _pieces(ctx: ServerContext, ids: list[int]) -> list[str]:
    return [ctx.tokenizer.decode([t]) for t in ids]


def _tops(ctx: ServerContext, tops: list[list[tuple[int, float]]], k: int) -> list[list[tuple[str, float]]]:
    return [[(ctx.tokenizer.decode([t]), lp) for t, lp in step[:k]] for step in tops]


async def chat_completions(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await parse_body(request, schemas.ChatBody)
    check_model(ctx, body.model)
    plan = await asyncio.to_thread(plan_chat, ctx.tokenizer, body)  # tools, tool_choice (serving/tools.py)
    prompt = plan.prompt_ids
    max_tokens = body.max_completion_tokens or body.max_tokens or ctx.config.chat_max_tokens
    k = (body.top_logprobs or 0) if body.logprobs else 0
    choices = [_Choice(ctx, 0, body.sampling(max_tokens, k, seed_offset=i)) for i in range(body.n)]
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": ctx.model_name}
    if body.stream:
        streams = await until_disconnected(request, open_streams(ctx, [(prompt, c.params) for c in choices]))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(
            _chat_events(ctx, meta, choices, streams, body.logprobs, len(prompt), include_usage), ctx
        )
    results = await until_disconnected(
        request, generate_all(ctx, [(prompt, c.params, None) for c in choices])
    )
    out = await asyncio.to_thread(_chat_response, ctx, meta, choices, results, body.logprobs, k, plan)
    ctx.metrics.record("chat.completions", sum(len(r.token_ids) for r in results))
    return JSONResponse(out)


def _chat_response(
    ctx: ServerContext,
    meta: dict[str, Any],
    choices: list[_Choice],
    results: list[GenerationResult],
    logprobs: bool,
    k: int,
    plan: ChatPlan,
) -> dict[str, Any]:
    out_choices = []
    for i, (choice, r) in enumerate(zip(choices, results, strict=True)):
        message, finish_reason = plan.reply(choice.text.feed(r.token_ids, r.finish_reason), r.finish_reason)
        entry: dict[str, Any] = {
            "index": i,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": None,
        }
        if logprobs:
            shown = choice.text.visible_tokens(r.token_ids, r.finish_reason)
            tops = _tops(ctx, r.top_logprobs, k) if k else None
            entry["logprobs"] = chat_logprobs(_pieces(ctx, shown), r.logprobs[: len(shown)], tops)
        out_choices.append(entry)
    version = results[0].versions[-1] if results[0].versions else ctx.engine.version
    return meta | {
        "object": "chat.completion",
        "choices": out_choices,
        "usage": usage(results[0].prompt_tokens, sum(len(r.token_ids) for r in results)),
        "system_fingerprint": f"policy-v{version}",
    }


async def _chat_events(
    ctx: ServerContext,
    meta: dict[str, Any],
    choices: list[_Choice],
    streams: list[tuple[AsyncIterator[GenerationChunk], GenerationChunk]],
    logprobs: bool,
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    head = meta | {"object": "chat.completion.chunk", "system_fingerprint": f"policy-v{ctx.engine.version}"}
    extra = {"usage": None} if include_usage else {}
    for i in range(len(choices)):
        delta = {"role": "assistant", "content": ""}
        yield sse(
            head
            | {"choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]}
            | extra
        )
    async for i, chunk in merged(streams):
        choice = choices[i]
        choice.completion_tokens += len(chunk.token_ids)
        text = choice.text.feed(chunk.token_ids, chunk.finish_reason)
        entry: dict[str, Any] = {"index": i, "delta": {"content": text} if text else {}, "logprobs": None}
        if logprobs:
            shown = choice.text.visible_tokens(chunk.token_ids, chunk.finish_reason)
            k = choice.params.top_logprobs
            tops = _tops(ctx, chunk.top_logprobs, k) if k else None
            entry["logprobs"] = chat_logprobs(_pieces(ctx, shown), chunk.logprobs[: len(shown)], tops)
        entry["finish_reason"] = chunk.finish_reason
        if text or chunk.finish_reason is not None or (logprobs and chunk.token_ids):
            yield sse(head | {"choices": [entry]} | extra)
    total = sum(c.completion_tokens for c in choices)
    ctx.metrics.record("chat.completions", total)
    if include_usage:
        yield sse(head | {"choices": [], "usage": usage(prompt_tokens, total)})


async def completions(request: Request) -> Response:
    ctx = ctx_of(request)
    body = await parse_body(request, schemas.CompletionBody)
    check_model(ctx, body.model)
    raw_prompts = body.prompts()
    prompts = await asyncio.to_thread(
        lambda: [p if isinstance(p, list) else encode_text(ctx, p) for p in raw_prompts]
    )
    texts = await asyncio.to_thread(lambda: [ctx.tokenizer.decode(p) if body.echo else "" for p in prompts])
    max_tokens = body.max_tokens or ctx.config.completion_max_tokens
    k = body.logprobs or 0
    choices = [
        _Choice(ctx, p, body.sampling(max_tokens, k, seed_offset=j))
        for p in range(len(prompts))
        for j in range(body.n)
    ]
    jobs = [(prompts[c.prompt_index], c.params) for c in choices]
    echoes = [texts[c.prompt_index] for c in choices]
    meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": ctx.model_name}
    prompt_tokens = sum(len(p) for p in prompts)
    if body.stream:
        streams = await until_disconnected(request, open_streams(ctx, jobs))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _completion_events(
            ctx, meta, choices, streams, body.logprobs, echoes, prompt_tokens, include_usage
        )
        return EventStream(events, ctx)
    results = await until_disconnected(request, generate_all(ctx, [(p, s, None) for p, s in jobs]))
    out = await asyncio.to_thread(_completion_response, ctx, meta, choices, results, body.logprobs, echoes)
    out["usage"] = usage(prompt_tokens, sum(len(r.token_ids) for r in results))
    ctx.metrics.record("completions", sum(len(r.token_ids) for r in results))
    return JSONResponse(out)


def _completion_response(
    ctx: ServerContext,
    meta: dict[str, Any],
    choices: list[_Choice],
    results: list[GenerationResult],
    logprobs: int | None,
    echoes: list[str],
) -> dict[str, Any]:
    out_choices = []
    for i, (choice, r) in enumerate(zip(choices, results, strict=True)):
        text = choice.text.feed(r.token_ids, r.finish_reason)
        entry: dict[str, Any] = {"index": i, "text": echoes[i] + text, "finish_reason": r.finish_reason}
        entry["logprobs"] = None
        if logprobs is not None:
            shown = choice.text.visible_tokens(r.token_ids, r.finish_reason)
            tops = _tops(ctx, r.top_logprobs, logprobs) if logprobs else None
            entry["logprobs"] = completion_logprobs(_pieces(ctx, shown), r.logprobs[: len(shown)], tops, 0)
        out_choices.append(entry)
    return meta | {"object": "text_completion", "choices": out_choices}


async def _completion_events(
    ctx: ServerContext,
    meta: dict[str, Any],
    choices: list[_Choice],
    streams: list[tuple[AsyncIterator[GenerationChunk], GenerationChunk]],
    logprobs: int | None,
    echoes: list[str],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    head = meta | {"object": "text_completion"}
    extra = {"usage": None} if include_usage else {}
    offsets = [0] * len(choices)
    for i, echo in enumerate(echoes):
        if echo:
            offsets[i] = len(echo)
            yield sse(
                head
                | {"choices": [{"index": i, "text": echo, "logprobs": None, "finish_reason": None}]}
                | extra
            )
    async for i, chunk in merged(streams):
        choice = choices[i]
        choice.completion_tokens += len(chunk.token_ids)
        text = choice.text.feed(chunk.token_ids, chunk.finish_reason)
        entry: dict[str, Any] = {
            "index": i,
            "text": text,
            "logprobs": None,
            "finish_reason": chunk.finish_reason,
        }
        if logprobs is not None:
            shown = choice.text.visible_tokens(chunk.token_ids, chunk.finish_reason)
            tops = _tops(ctx, chunk.top_logprobs, logprobs) if logprobs else None
            entry["logprobs"] = completion_logprobs(
                _pieces(ctx, shown), chunk.logprobs[: len(shown)], tops, offsets[i]
            )
        offsets[i] += len(text)
        if text or chunk.finish_reason is not None or (logprobs is not None and chunk.token_ids):
            yield sse(head | {"choices": [entry]} | extra)
    total = sum(c.completion_tokens for c in choices)
    ctx.metrics.record("completions", total)
    if include_usage:
        yield sse(head | {"choices": [], "usage": usage(prompt_tokens, total)})


def policy_version_header(request: Request) -> int:
    raw = request.headers.get(POLICY_VERSION_HEADER)
    if raw is None:
        message = f"the {POLICY_VERSION_HEADER} header is required (the version of the pushed weights)"
        raise ApiError(400, message, param=POLICY_VERSION_HEADER)
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > schemas.INT64_MAX:
        message = f"the {POLICY_VERSION_HEADER} header must be an integer >= 0, got {raw[:40]!r}"
        raise ApiError(400, message, param=POLICY_VERSION_HEADER)
    return int(raw)


def check_not_stale(ctx: ServerContext, version: int) -> None:
    """Refuse a stale push before reading its (possibly large) body."""
    check_version(ctx.engine.version, version)


async def load_weights(request: Request) -> Response:
    ctx = ctx_of(request)
    check_content_type(request, ("application/json",), missing_ok=False)
    body = await parse_body(request, schemas.WeightsLoadBody)
    check_not_stale(ctx, body.version)
    version = await ctx.engine.update_weights(body.path, body.version)
    ctx.metrics.record("weights")
    return JSONResponse({"version": version})


async def state_dict_weights(request: Request) -> Response:
    from agentrl.serving.weights import read_safetensors_bytes

    ctx = ctx_of(request)
    check_content_type(request, ("application/octet-stream",), missing_ok=True)
    version = policy_version_header(request)
    check_not_stale(ctx, version)
    raw = await read_body(request, ctx.config.max_weights_bytes)
    state = await asyncio.to_thread(read_safetensors_bytes, raw)
    version = await ctx.engine.update_weights(state, version)
    ctx.metrics.record("weights")
    return JSONResponse({"version": version})


# ---- the app ----------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def endpoint(handler: Handler, access: str) -> Handler:
    """Access checks, then the handler; anything raised becomes an OpenAI error response."""

    async def run(request: Request) -> Response:
        ctx = ctx_of(request)
        try:
            check_access(request, access, ctx.config)
            response = await handler(request)
        except ClientGone:
            response = Response(status_code=499)  # nobody reads it; uvicorn drops it
        except Exception as exc:
            error = as_api_error(exc, ctx.config.retry_after_s)
            if error.status == 429:
                ctx.metrics.rejected_overload += 1
            elif error.status == 400:
                ctx.metrics.bad_requests += 1
            response = error_response(error)
        key = str(response.status_code)
        ctx.metrics.statuses[key] = ctx.metrics.statuses.get(key, 0) + 1
        return response

    run.__name__ = run.__qualname__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


ROUTES: list[tuple[str, Handler, list[str], str]] = [
    ("/health", health, ["GET"], OPEN),
    ("/metrics", metrics, ["GET"], OPEN),
    ("/openapi.json", openapi, ["GET"], OPEN),
    ("/v1/models", list_models, ["GET"], GENERATE),
    ("/v1/models/{model:path}", get_model, ["GET"], GENERATE),
    ("/v1/generate", generate, ["POST"], GENERATE),
    ("/v1/chat/completions", chat_completions, ["POST"], GENERATE),
    ("/v1/completions", completions, ["POST"], GENERATE),
    ("/v1/sessions/release", release_sessions, ["POST"], SESSION),
    ("/v1/sessions/{session_id}", end_session, ["DELETE"], SESSION),
    ("/v1/weights/load", load_weights, ["POST"], ADMIN),
    ("/v1/weights/state_dict", state_dict_weights, ["POST"], ADMIN),
]


def create_app(
    engine: Engine,
    tokenizer: ChatTokenizer,
    model_name: str,
    *,
    config: ServerConfig | None = None,
    manage_engine: bool = True,
) -> Starlette:
    """The ASGI app. With `manage_engine`, the app's lifespan starts and stops the engine."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        yield
        if manage_engine:
            await engine.stop()

    app = Starlette(
        routes=[
            Route(path, endpoint(handler, access), methods=methods)
            for path, handler, methods, access in ROUTES
        ],
        exception_handlers={HTTPException: http_exception_handler},
        lifespan=lifespan,
    )
    app.state.ctx = ServerContext(engine, tokenizer, model_name, config or ServerConfig())
    return app
