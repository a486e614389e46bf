"""Size and read speed of the trajectory store, beside plain and gzipped JSON lines of the same episodes.

    python bench/recording_size.py STORE_DIR

Reads every episode of a store (e.g. one written by `agentrl rollout ... --record STORE_DIR`),
then prints, per 1,000 episodes: the store's bytes on disk, the bytes of the same episodes as
JSON lines (every Trajectory field, numbers as JSON) uncompressed and gzipped, and the seconds
to list the store (summaries) and to decode every episode. The figures in the README
came from this script.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import time
from pathlib import Path

from agentrl.recording import Recording


def main(directory: str) -> None:
    store_dir = Path(directory)
    started = time.perf_counter()
    store = Recording(store_dir)
    listed = time.perf_counter() - started
    started = time.perf_counter()
    records = list(store.episodes())
    decoded = time.perf_counter() - started
    n = len(records)
    if n == 0:
        raise SystemExit(f"{store_dir} holds no episodes")
    store_bytes = sum(p.stat().st_size for p in store.files())
    lines = b"".join(
        json.dumps(dataclasses.asdict(r.trajectory), default=str).encode() + b"\n" for r in records
    )
    gzipped = gzip.compress(lines, 6)
    turns = sum(len(r.trajectory.turns) for r in records)
    tokens = sum(len(r.trajectory.token_ids()) for r in records)
    sampled = sum(r.trajectory.num_action_tokens for r in records)
    per_k = 1000 / n
    print(f"{n} episodes, {turns / n:.1f} turns and {tokens / n:.0f} tokens ({sampled / n:.0f} sampled) each")
    print(f"store (.arl)        {store_bytes * per_k / 1e6:8.2f} MB per 1,000 episodes")
    print(
        f"JSON lines          {len(lines) * per_k / 1e6:8.2f} MB per 1,000 episodes "
        f"({len(lines) / store_bytes:.1f}x the store)"
    )
    print(
        f"JSON lines, gzip -6 {len(gzipped) * per_k / 1e6:8.2f} MB per 1,000 episodes "
        f"({len(gzipped) / store_bytes:.2f}x the store)"
    )
    print(f"list (summaries)    {listed * per_k:8.3f} s per 1,000 episodes")
    print(f"decode every record {decoded * per_k:8.3f} s per 1,000 episodes")


if __name__ == "__main__":
    main(sys.argv[1])
