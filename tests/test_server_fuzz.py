"""Property-based fuzzing of the policy server from its own /openapi.json: no body, header or
parameter gets a 5xx, and every error has an OpenAI error body.

Bodies are drawn from the request schemas (values that mostly pass validation, so the engine is
exercised too) with any field swapped for arbitrary JSON (deep nesting, huge integers, lone
surrogates, special-token text), unknown fields added, or the raw bytes garbled. The model's
context is 64 tokens, so no example generates for long; the example count is bounded (the whole
module takes well under a minute on a loaded 2-core machine).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.engine import TorchEngine
from agentrl.serving.server import ServerConfig, create_app
from agentrl.tokenizer import ChatTokenizer
from tests.server_thread import server_in_thread

GEN, ADMIN = "fuzz-gen", "fuzz-admin"  # keys on: the access checks are fuzzed too
EXAMPLES = 100  # the raw test; each schema-driven route gets half

ODD_TEXT = st.sampled_from(
    ["", "\ud800", "a\udfffb", "<|im_end|>", "<|im_start|>user", "\x00", "é🙂", " " * 300]
)
TEXT = st.text(max_size=24) | ODD_TEXT
SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, 1, -1, 2**63, 2**64, 1e-40, 5e-324, 1e308])
    | TEXT
)
ANY_JSON = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8
)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    ckpt = init_checkpoint(tmp_path_factory.mktemp("short"), "tiny", vocab_size=512, max_positions=64)
    engine = TorchEngine.from_pretrained(ckpt, max_queue=64)
    app = create_app(engine, ChatTokenizer(ckpt), "tiny", config=ServerConfig(api_key=GEN, admin_key=ADMIN))
    with server_in_thread(app) as base:
        yield base


@pytest.fixture(scope="module")
def http(url):
    with httpx.Client(base_url=url, timeout=20) as client:
        yield client


@pytest.fixture(scope="module")
def spec(http):
    return http.get("/openapi.json").json()


def from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """Values that mostly satisfy `schema` (small numbers, short lists), for a valid-ish body."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs, depth)
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs, depth) for s in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        low = max(schema.get("minimum", 0), -5)
        high = min(schema.get("maximum", low + 4), low + 4)
        return st.integers(min_value=low, max_value=max(low, high))
    if kind == "number":
        return st.floats(min_value=0.0, max_value=2.0) | st.sampled_from([0.0, 1e-40, 5e-324, 1.0])
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return TEXT
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs, depth + 1) if depth < 3 else SCALAR
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=3)
    if kind == "object" and "properties" in schema and depth < 4:
        return body_for(schema, defs, depth + 1)
    if kind == "object":
        return st.dictionaries(st.text(max_size=4), SCALAR, max_size=2)
    return ANY_JSON


def body_for(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or draw(st.integers(0, 3)) == 0:
                wild = draw(st.integers(0, 9)) == 0
                body[name] = draw(ANY_JSON if wild else from_schema(sub, defs, depth))
        if draw(st.integers(0, 9)) == 0:
            body[draw(TEXT)] = draw(ANY_JSON)
        return body

    return build()


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


JSON_ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/generate",
    "/v1/sessions/release",
    "/v1/weights/load",
]


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_no_schema_driven_body_gets_a_5xx(http, spec, route):
    defs = spec["components"]["schemas"]
    ref = spec["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = defs[ref.rsplit("/", 1)[1]]

    @settings(
        max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(body=body_for(schema, defs))
    def run(body: dict[str, Any]) -> None:
        if route == "/v1/weights/load" and isinstance(body.get("path"), str):
            body["path"] = "/nonexistent/" + body["path"]  # never a real checkpoint: weights stay
        raw = json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\ud800 escapes
        key = ADMIN if route.startswith("/v1/weights") else GEN
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        check(http.post(route, content=raw, headers=headers))

    run()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    route=st.sampled_from([*JSON_ROUTES, "/v1/weights/state_dict", "/v1/models", "/nope"]),
    method=st.sampled_from(["POST", "GET", "PUT", "DELETE"]),
    raw=st.binary(max_size=64) | ANY_JSON.map(lambda v: json.dumps(v).encode()[:200]) | st.just(b"[" * 5000),
    version=st.none() | st.text(max_size=8) | st.integers(-5, 2**70).map(str),
    content_type=st.none()
    | st.sampled_from(["application/json", "text/plain", "application/octet-stream", "x"]),
    origin=st.none() | st.sampled_from(["http://evil.example", "null", "http://[::1"]),
    auth=st.none()
    | st.sampled_from([f"Bearer {GEN}", f"Bearer {ADMIN}", "Basic y", "Bearer", "", b"Bearer \xff\x80"]),
)
def test_no_raw_body_or_header_gets_a_5xx(http, route, method, raw, version, content_type, origin, auth):
    headers = {
        "X-Policy-Version": version,
        "Content-Type": content_type,
        "Origin": origin,
        "Authorization": auth,
    }
    headers = {
        k: v
        for k, v in headers.items()
        if isinstance(v, bytes) or (v is not None and v.isprintable() and v.isascii())
    }
    check(http.request(method, route, content=raw, headers=headers))


def test_the_server_is_healthy_after_the_fuzzing(http):
    assert http.get("/health").json()["status"] == "ok"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {GEN}"})
    assert r.status_code == 200
