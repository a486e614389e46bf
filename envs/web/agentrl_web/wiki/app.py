"""The knowledge site as a Starlette app: a home page with search, and one page per article.

Sessions keep episodes apart and record each episode's trail of visited articles (bounded), so
a standalone server can be inspected per episode; the site's content itself is read-only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from html import escape

from agentrl_web.pages import expired, link, page, search_form, session_api_routes
from agentrl_web.sessions import SessionStore
from agentrl_web.wiki.world import Article, Ref, build_world
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MAX_TRAIL = 256


@dataclass
class WikiSession:
    trail: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_TRAIL))


def create_app(world_seed: int = 0, *, max_sessions: int = 4096, ttl: float = 1800.0) -> Starlette:
    world = build_world(world_seed)
    store: SessionStore[WikiSession] = SessionStore(WikiSession, max_sessions=max_sessions, ttl=ttl)

    def render(sid: str, article: Article) -> str:
        paragraphs = "".join(
            "<p>"
            + "".join(link(f"/s/{sid}/wiki/{s.slug}", s.text) if isinstance(s, Ref) else escape(s) for s in p)
            + "</p>"
            for p in article.paragraphs
        )
        return f"<nav>{link(f'/s/{sid}/', 'Home')}</nav><h1>{escape(article.title)}</h1>{paragraphs}"

    async def home(request: Request) -> Response:
        sid = request.path_params["sid"]
        if store.get(sid) is None:
            return expired(sid)
        featured = "".join(
            f"<li>{link(f'/s/{sid}/wiki/{s}', world.articles[s].title)}</li>" for s in world.featured
        )
        return page(
            "Wiki",
            "<h1>Wiki</h1>" + search_form(f"/s/{sid}/search") + f"<h2>Countries</h2><ul>{featured}</ul>",
        )

    async def search(request: Request) -> Response:
        sid = request.path_params["sid"]
        if store.get(sid) is None:
            return expired(sid)
        query = request.query_params.get("q", "")
        results = world.search(query)
        items = "".join(f"<li>{link(f'/s/{sid}/wiki/{a.slug}', a.title)}</li>" for a in results)
        body = (
            f"<nav>{link(f'/s/{sid}/', 'Home')}</nav>"
            + search_form(f"/s/{sid}/search", query)
            + (f"<ul>{items}</ul>" if results else f"<p>No articles match {escape(query)}.</p>")
        )
        return page(f"Search: {query}", body)

    async def article(request: Request) -> Response:
        sid, slug = request.path_params["sid"], request.path_params["slug"]
        if (state := store.get(sid)) is None:
            return expired(sid)
        if slug not in world.articles:
            return page(
                "Not found",
                f"<nav>{link(f'/s/{sid}/', 'Home')}</nav><p>No article named {escape(slug)}.</p>",
                status=404,
            )
        state.trail.append(slug)
        return page(world.articles[slug].title, render(sid, world.articles[slug]))

    async def trail(request: Request) -> Response:
        sid = request.path_params["sid"]
        if (state := store.get(sid)) is None:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        return JSONResponse({"trail": list(state.trail)})

    routes = [
        *session_api_routes("wiki", store, {"seed": world_seed, "articles": len(world.articles)}),
        Route("/api/sessions/{sid}/trail", trail),
        Route("/s/{sid}/", home),
        Route("/s/{sid}/search", search),
        Route("/s/{sid}/wiki/{slug}", article),
    ]
    app = Starlette(routes=routes)
    app.state.sessions = store
    return app
