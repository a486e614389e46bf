"""The viewer's HTTP server: the standard library's threaded server, loopback by default.

Routes (all GET):
    /                       the page (static files ship inside the package: no CDN, works offline)
    /static/<file>          its script and style sheet
    /api/runs               every run under the root, with its steps, envs and stop reasons
    /api/episodes?run=R&... episode summaries of run R matching the filters (step, env, seed,
                            stop_reason, source, policy, success, min_reward, max_reward,
                            superseded: false by default, true or any)
    /api/episode?run=R&key=K one episode with its turns and per-token log-probs and versions
    /api/metrics?run=R      the run's metrics.jsonl records, for the curves

Bad input is a 4xx with a JSON `{"error": ...}` body; the server never changes anything on disk.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from agentrl.viewer.catalog import BadQuery, Catalog

logger = logging.getLogger(__name__)

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return resources.files("agentrl.viewer").joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, _static("index.html"), STATIC["index.html"])
            elif url.path.startswith("/static/") and url.path[len("/static/") :] in STATIC:
                name = url.path[len("/static/") :]
                self._send(HTTPStatus.OK, _static(name), STATIC[name])
            elif url.path.startswith("/api/"):
                self._json(HTTPStatus.OK, self._api(url.path[len("/api/") :], query))
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path}"})
        except BadQuery as exc:
            self._json(HTTPStatus(exc.status), {"error": str(exc)})
        except Exception as exc:  # a bug, not bad input: log it, answer, keep serving
            logger.exception("viewer request %s failed", self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

    def _api(self, route: str, query: dict[str, str]) -> Any:
        catalog = self.server.catalog
        if route == "runs":
            return catalog.runs()
        if route not in ("episodes", "episode", "metrics"):
            raise BadQuery(f"no API route {route!r}", 404)
        if "run" not in query:
            raise BadQuery("the run parameter is required")
        run = catalog.run(query["run"])
        if route == "episodes":
            return run.episodes(query)
        if route == "metrics":
            return run.metrics()
        if not query.get("key"):
            raise BadQuery("the key parameter is required")
        return run.episode(query["key"])

    def _json(self, status: HTTPStatus, body: Any) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    catalog: Catalog


class ViewerServer:
    """Serve a `Catalog` over HTTP; `start()` runs it in a thread, `serve_forever()` in the caller."""

    def __init__(self, catalog: Catalog, host: str = "127.0.0.1", port: int = 0) -> None:
        self.httpd = _Server((host, port), _Handler)
        self.httpd.catalog = catalog
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ViewerServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="agentrl-viewer", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> ViewerServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
