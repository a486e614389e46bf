"""Does a model read GuessNumber's feedback? P(next guess inside the range the hints leave open).

    python bench/feedback_probe.py --model DIR                        # probe a checkpoint
    python bench/feedback_probe.py --size tiny --sft-epochs 4         # build, warm-start, probe

Issue 15's finding in one number. States come from format-correct random play on held-out seeds
of `games/GuessNumberInterval-v0` (replies like `higher (6-10)`), 1-3 guesses in; at each, the
model scores every number 1-10 as its next answer (the log-probability of `N</answer>` after
`<answer>`, so multi-token numbers count whole). A model that ignores the replies puts the
uniform share of its mass inside the open range; one that reads them puts more. A model can also
beat uniform by keying on the reply's word alone (big numbers after "higher"), so each line also
gives the best any word-only answer reaches on the same states (the one number most often inside
after that word): above it, the model reads the numbers (or its own earlier guesses).

With `--size` the model is built from scratch and warm-started on `--sft-policy` play (default
`random_in_hints`: the strategy itself, so the probe measures whether supervised learning at that
budget builds the reading at all; `random` gives RL's starting point).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from agentrl_trainers.sft import warm_start

import agentrl
from agentrl.serving.checkpoint import init_checkpoint
from agentrl.serving.model import CausalLM
from agentrl.tokenizer import ChatTokenizer

ENV_ID = "games/GuessNumberInterval-v0"
EVAL_SEED = 1_000_000  # held-out seeds, as `agentrl eval` uses


def probe_states(count: int) -> list[tuple[list[dict[str, str]], int, int, str]]:
    """(messages up to the next answer, low, high, reply word) from random play on held-out seeds."""
    env = agentrl.make(ENV_ID)
    rng = np.random.default_rng(0)
    states = []
    seed = EVAL_SEED
    while len(states) < count:
        observation, _ = env.reset(seed=seed)
        messages = [
            {"role": "system", "content": env.system_prompt},
            {"role": "user", "content": observation},
        ]
        for _ in range(int(rng.integers(1, 4))):
            guess = int(rng.integers(env.lo, env.hi + 1))
            observation, _, terminated, _, _ = env.step(f"<answer>{guess}</answer>")
            if terminated:
                break
            messages += [
                {"role": "assistant", "content": f"<answer>{guess}</answer>"},
                {"role": "user", "content": observation},
            ]
        else:
            states.append((messages, env.low, env.high, observation.split()[0]))
        seed += 1
    env.close()
    return states


@torch.no_grad()
def inside_mass(
    model: CausalLM, tokenizer: ChatTokenizer, messages: list[dict[str, str]], low: int, high: int
) -> float:
    """The model's probability, among the answers 1-10, of one in [low, high]."""
    prompt = tokenizer.encode_chat(messages, add_generation_prompt=True) + tokenizer.encode("<answer>")
    scores = []
    for number in range(1, 11):
        tail = tokenizer.encode(f"{number}</answer>")
        ids = torch.tensor([prompt + tail])
        logprobs = torch.log_softmax(model(ids)[0, len(prompt) - 1 : -1].float(), dim=-1)
        scores.append(float(logprobs.gather(1, torch.tensor(tail)[:, None]).sum()))
    probs = np.exp(np.array(scores) - max(scores))
    probs /= probs.sum()
    return float(probs[low - 1 : high].sum())


def warm_started(size: str, policy: str, episodes: int, epochs: int, out: Path) -> Path:
    init_checkpoint(out / "init", size, seed=0)
    started = time.perf_counter()
    result = asyncio.run(
        warm_start(
            out / "init",
            out / "sft",
            ENV_ID,
            episodes=episodes,
            epochs=epochs,
            batch_size=8,
            lr=1e-3,
            seed_start=2_000_000,
            env_kwargs={},
            max_turns=5,
            seed=0,
            player=policy,
            only_successful=False,
        )
    )
    print(
        f"warm start: {size} model, {episodes} {policy!r} episodes x {epochs} epochs = {result.steps} steps, "
        f"loss {result.first_loss:.3f} -> {result.final_loss:.3f}, {time.perf_counter() - started:.0f} s"
    )
    return out / "sft"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="probe this checkpoint directory")
    parser.add_argument("--size", default="tiny", help="build this size when --model is not given")
    parser.add_argument("--sft-policy", default="random_in_hints")
    parser.add_argument("--sft-episodes", type=int, default=1024)
    parser.add_argument("--sft-epochs", type=int, default=1)
    parser.add_argument("--states", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        path = args.model or warm_started(
            args.size, args.sft_policy, args.sft_episodes, args.sft_epochs, Path(scratch)
        )
        tokenizer, model = ChatTokenizer(path), CausalLM.from_pretrained(path).eval()
        states = probe_states(args.states)
        rows = [
            (inside_mass(model, tokenizer, m, low, high), low, high, word) for m, low, high, word in states
        ]
    for word in sorted({w for *_, w in rows}):
        picked = [(p, low, high) for p, low, high, w in rows if w == word]
        model_mean = float(np.mean([p for p, _, _ in picked]))
        uniform = float(np.mean([(high - low + 1) / 10 for _, low, high in picked]))
        word_only = max(float(np.mean([low <= n <= high for _, low, high in picked])) for n in range(1, 11))
        print(
            f"after {word!r:8} ({len(picked):3d} states): P(inside) model {model_mean:.3f}, "
            f"uniform {uniform:.3f}, best word-only answer {word_only:.3f}"
        )


if __name__ == "__main__":
    main()
