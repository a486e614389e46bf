"""Throughput and turn latency of the embedded policy engine, printed as ratios to baselines.

    python bench/policy_server.py [--model DIR] [--size small] [--turns 3] [--tokens 32]

1. Generated tokens/s with 1, 16, 64, 256 concurrent multi-turn sessions (each turn: the
   session's whole history + 8 new observation tokens, session prefix reuse on), against
   one-at-a-time generation through the same engine and against `transformers` `generate`
   (batch 1, KV cache, same checkpoint, same number of new tokens).
2. Latency of one turn vs history length, with the session prefix kept (reuse) and without.

Sampling is at temperature 1 with EOS disabled so every turn generates exactly --tokens tokens.
The machine is shared: compare the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch

from agentrl.generation import SamplingParams
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.engine import TorchEngine

OBSERVATION = 8


async def session(engine: TorchEngine, sid: str, turns: int, params: SamplingParams, reuse: bool) -> int:
    history = [(7 * hash(sid) + i) % 500 + 10 for i in range(32)]
    generated = 0
    for _ in range(turns):
        out = await engine.generate(history, params, session_id=sid if reuse else None)
        generated += len(out.token_ids)
        history += out.token_ids + [(len(history) + i) % 500 + 10 for i in range(OBSERVATION)]
    engine.drop_sessions([sid])
    return generated


async def throughput(engine: TorchEngine, concurrent: int, turns: int, params: SamplingParams) -> float:
    start = time.perf_counter()
    counts = await asyncio.gather(
        *(session(engine, f"s{concurrent}-{i}", turns, params, True) for i in range(concurrent))
    )
    return sum(counts) / (time.perf_counter() - start)


async def one_at_a_time(engine: TorchEngine, n: int, turns: int, params: SamplingParams) -> float:
    start, total = time.perf_counter(), 0
    for i in range(n):
        total += await session(engine, f"seq-{i}", turns, params, True)
    return total / (time.perf_counter() - start)


def transformers_generate(model_dir: Path, n: int, tokens: int, device: str) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval().to(device)
    prompt = torch.randint(10, 500, (1, 40), device=device)
    total, start = 0, time.perf_counter()
    with torch.inference_mode():
        for _ in range(n):
            out = model.generate(
                prompt,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=0,
            )
            total += out.shape[1] - prompt.shape[1]
    return total / (time.perf_counter() - start)


async def turn_latency(
    engine: TorchEngine, history_len: int, reuse: bool, params: SamplingParams, reps: int
) -> float:
    history = [(i * 31) % 500 + 10 for i in range(history_len)]
    sid = f"lat-{history_len}-{reuse}"
    times = []
    for _ in range(reps + 1):
        out = await engine.generate(history, params, session_id=sid if reuse else None)
        history = history + out.token_ids + [11] * OBSERVATION
        start = time.perf_counter()
        out = await engine.generate(history, params, session_id=sid if reuse else None)
        times.append(time.perf_counter() - start)
        history = history[:history_len]
        engine.drop_sessions([sid])
    return sorted(times[1:])[len(times[1:]) // 2] * 1000  # median, first rep is warm-up


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: init one of --size)")
    ap.add_argument("--size", default="small")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per turn")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--histories", type=int, nargs="+", default=[64, 256, 512, 1024, 1792])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both engines run there)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = args.model or init_checkpoint(Path(tempfile.mkdtemp()) / args.size, args.size)
    engine = TorchEngine.from_pretrained(model_dir, device=args.device)
    engine.eos_token_ids = frozenset()  # fixed-length turns: every turn generates --tokens tokens
    await engine.start()
    params = SamplingParams(max_tokens=args.tokens, temperature=1.0)
    n_params = engine.model.num_parameters()
    print(
        f"model {model_dir} ({n_params / 1e6:.1f}M params) on {args.device}, torch threads {args.threads}, "
        f"{args.turns} turns x {args.tokens} tokens per session"
    )

    await throughput(engine, 4, 1, params)  # warm-up
    hf = transformers_generate(model_dir, 4, args.tokens, args.device)
    seq = await one_at_a_time(engine, 4, args.turns, params)
    print(
        f"\nbaselines: one-at-a-time (this engine) {seq:8.1f} tok/s | transformers generate {hf:8.1f} tok/s"
    )
    print(f"{'sessions':>9} {'tok/s':>9} {'x one-at-a-time':>16} {'x transformers':>15}")
    for c in args.concurrency:
        tps = await throughput(engine, c, args.turns, params)
        print(f"{c:>9} {tps:>9.1f} {tps / seq:>16.2f} {tps / hf:>15.2f}")

    print(f"\nturn latency (ms, median) vs history; {OBSERVATION} new tokens + {args.tokens // 2} sampled")
    short = SamplingParams(max_tokens=args.tokens // 2, temperature=1.0)
    print(f"{'history':>8} {'reuse':>8} {'no reuse':>9} {'ratio':>6}")
    for h in args.histories:
        if h + args.tokens + OBSERVATION >= engine.max_len:
            continue
        on = await turn_latency(engine, h, True, short, 3)
        off = await turn_latency(engine, h, False, short, 3)
        print(f"{h:>8} {on:>8.1f} {off:>9.1f} {off / on:>6.2f}")
    await engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
