"""Small HTML building blocks shared by the apps, and the session/API routes both expose.

Every in-app URL starts with `/s/{session}/`, so one server keeps hundreds of episodes apart
without cookies (a shared httpx client has one cookie jar for every env using it).
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import parse_qs

from agentrl_web.sessions import SessionStore
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route


def page(title: str, body: str, *, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><title>{escape(title)}</title></head><body>{body}</body></html>",
        status_code=status,
    )


def link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


def button_form(action: str, text: str, fields: dict[str, str] | None = None) -> str:
    """A one-button POST form; `fields` travel as hidden inputs."""
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in (fields or {}).items()
    )
    button = f'<button type="submit">{escape(text)}</button>'
    return f'<form method="post" action="{escape(action)}">{hidden}{button}</form>'


def search_form(action: str, query: str = "") -> str:
    return (
        f'<form method="get" action="{escape(action)}"><input type="text" name="q" value="{escape(query)}" '
        f'placeholder="search"><button type="submit">Search</button></form>'
    )


async def form_data(request: Request) -> dict[str, str]:
    """The url-encoded body of a POST (first value per field); no multipart dependency needed."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def expired(sid: str) -> HTMLResponse:
    return page("Session expired", f"<p>Session {escape(sid)} does not exist or has expired.</p>", status=404)


def session_api_routes(app_name: str, store: SessionStore[Any], info: dict[str, Any]) -> list[Route]:
    """`POST /api/sessions` (new episode), `DELETE /api/sessions/{sid}`, `GET /api/info`."""

    async def create(request: Request) -> Response:
        return JSONResponse({"session": store.create()}, status_code=201)

    async def delete(request: Request) -> Response:
        return JSONResponse({"deleted": store.delete(request.path_params["sid"])})

    async def describe(request: Request) -> Response:
        return JSONResponse({"app": app_name, "sessions": len(store), **info})

    return [
        Route("/api/sessions", create, methods=["POST"]),
        Route("/api/sessions/{sid}", delete, methods=["DELETE"]),
        Route("/api/info", describe),
    ]
