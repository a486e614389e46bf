"""RSS of the embedded engine after a burst: idle shrink on (ours) beside off (the old behaviour).

Each variant runs in its own fresh process (RSS of one run would pollute the other): load the
model, warm up with one request, send a burst of concurrent requests, wait until idle, report
RSS before / peak / after. Usage:

    python bench/serving_memory.py MODEL_DIR [--burst 256] [--prompt 300] [--tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS (Linux only)")


async def one_variant(model_dir: str, shrink: bool, burst: int, prompt_len: int, tokens: int) -> dict:
    from agentrl.generation import SamplingParams
    from agentrl.serving.engine import TorchEngine

    engine = TorchEngine.from_pretrained(model_dir)
    engine.eos_token_ids = frozenset()
    if not shrink:
        engine._shrink_when_idle = lambda: None  # the old engine: the cache keeps its peak size
    await engine.start()
    params = SamplingParams(max_tokens=tokens, temperature=1.0)
    prompt = list(range(5, 5 + prompt_len))
    await engine.generate(prompt, params)
    await asyncio.sleep(0.2)
    before = peak = rss_mib()
    sent = asyncio.gather(*(engine.generate(prompt, params) for _ in range(burst)))
    while not sent.done():
        peak = max(peak, rss_mib())
        await asyncio.sleep(0.01)
    await sent
    await asyncio.sleep(0.5)
    after = rss_mib()
    kv = engine.metrics()["kv_cache_bytes"] / 2**20
    await engine.stop()
    return {"before": before, "peak": peak, "after": after, "kv_cache_mib_after": kv}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--variant", choices=["shrink", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        result = asyncio.run(
            one_variant(args.model_dir, args.variant == "shrink", args.burst, args.prompt, args.tokens)
        )
        print(json.dumps(result))
        return
    rows = {}
    for variant in ("keep", "shrink"):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, args.model_dir, "--burst", str(args.burst),
             "--prompt", str(args.prompt), "--tokens", str(args.tokens), "--variant", variant],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1]) | {"s": time.perf_counter() - t0}
    print(f"burst of {args.burst} requests, {args.prompt}-token prompt, {args.tokens} tokens each")
    for name, label in (("keep", "cache kept at peak (old)"), ("shrink", "idle shrink (ours)")):
        r = rows[name]
        print(
            f"  {label:26s} RSS before {r['before']:6.0f} MiB  peak {r['peak']:6.0f} MiB  "
            f"idle after {r['after']:6.0f} MiB  (KV cache after: {r['kv_cache_mib_after']:.0f} MiB)"
        )
    kept = rows["keep"]["after"] - rows["keep"]["before"]
    ours = rows["shrink"]["after"] - rows["shrink"]["before"]
    print(f"  RSS growth left after the burst: old {kept:.0f} MiB, ours {ours:.0f} MiB")


if __name__ == "__main__":
    main()
