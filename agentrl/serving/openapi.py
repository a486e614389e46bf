"""/openapi.json: the server's routes and request bodies, generated from the pydantic models.

Clients and schema-driven fuzzers (the test suite runs one) read it; it is built from the same
models that validate the requests, so it cannot drift from what the server accepts.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic.json_schema import models_json_schema

from agentrl.serving import schemas

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}

_ERRORS = {
    "400": "invalid request (the message names the parameter)",
    "401": "missing or wrong key",
    "404": "unknown model",
    "413": "body too large",
    "429": "queue full; see Retry-After",
    "503": "engine not running or dead",
}


def _responses(extra: dict[str, str] | None = None) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    out: dict[str, Any] = {"200": {"description": "OK"}}
    for code, text in (_ERRORS | (extra or {})).items():
        out[code] = {"description": text} | error
    return out


@cache
def openapi_document(model_name: str) -> dict[str, Any]:
    bodies = list(schemas.ROUTE_BODIES.items())
    _, top = models_json_schema(
        [(model, "validation") for _, model in bodies], ref_template="#/components/schemas/{model}"
    )
    components: dict[str, Any] = dict(top.get("$defs", {}))
    components["Error"] = ERROR_SCHEMA
    security = [{"bearer": []}]
    paths: dict[str, Any] = {}
    for path, model in bodies:
        paths[path] = {
            "post": {
                "operationId": path.strip("/").replace("/", "_"),
                "summary": (model.__doc__ or "").strip().split("\n")[0],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                    },
                },
                "responses": _responses({"409": "stale version"} if path == "/v1/weights/load" else None),
                "security": security,
            }
        }
    paths["/v1/weights/state_dict"] = {
        "post": {
            "operationId": "v1_weights_state_dict",
            "summary": "Replace the weights with a safetensors state dict, served as X-Policy-Version.",
            "parameters": [
                {
                    "name": "X-Policy-Version",
                    "in": "header",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            },
            "responses": _responses({"409": "stale version", "415": "wrong content type"}),
            "security": security,
        }
    }
    paths["/v1/sessions/{session_id}"] = {
        "delete": {
            "operationId": "v1_sessions_delete",
            "parameters": [
                {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": _responses(),
            "security": security,
        }
    }
    for path in ("/health", "/metrics", "/v1/models"):
        paths[path] = {"get": {"operationId": path.strip("/").replace("/", "_"), "responses": _responses()}}
    return {
        "openapi": "3.1.0",
        "info": {"title": f"agentrl policy server ({model_name})", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
