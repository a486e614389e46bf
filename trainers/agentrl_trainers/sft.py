"""Warm start: supervised fine-tuning on an env's scripted player, tokenized as RL will see it.

A freshly initialised model cannot produce `<answer>5</answer>`, so RL from scratch would see
only format errors. A short SFT pass on scripted episodes teaches the action format so that RL
starts from a policy that sometimes succeeds. The player is the env's expert by default, which
also teaches some of the strategy; any of the env's reference policies can be used instead
(`sft.policy`), e.g. "random" for a warm start that knows the format and nothing else, so what
RL adds on top is the use of the env's feedback.

The scripted episodes are played by the real `EnvManager` with `ScriptedTokenPolicy`, which lays out
each turn's tokens with the same `TokenLedger` the RL policy client uses (the action is the
encoded text followed by the end-of-turn token, what the engine samples when it stops). So the
SFT sequences are the RL trajectories' token layout by construction, and the loss is on the
action tokens only (the trajectory's loss mask).
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl.errors import InvalidArgumentError
from agentrl.rollout.ledger import TokenLedger
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.protocol import PolicyInput, PolicyOutput
from agentrl.serving.model import CausalLM
from agentrl.tokenizer import ChatTokenizer
from agentrl.trajectory import Trajectory

# Everything in a checkpoint directory that is not the weights: copied along with new weights.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


class ScriptedTokenPolicy:
    """A scripted player (the env's expert or one of its reference policies), emitting the exact
    token bookkeeping of the policy client."""

    def __init__(self, tokenizer: ChatTokenizer, player: str = "expert") -> None:
        self.tokenizer = tokenizer
        self.player = player
        self._ledgers: dict[str, TokenLedger] = {}

    async def __call__(self, request: PolicyInput) -> PolicyOutput:
        ledger = self._ledgers.setdefault(request.episode_id, TokenLedger(self.tokenizer))
        messages = [dict(m) for m in request.messages]
        prompt = ledger.next_prompt(messages, tools=request.tools)
        env = request.env
        text = env.expert_action() if self.player == "expert" else env.reference_action(self.player)
        action = ledger.action_tokens(text)
        ledger.record(prompt, action, messages_seen=len(messages))
        return PolicyOutput(
            text=text,
            prompt_token_ids=prompt,
            token_ids=action,
            logprobs=[0.0] * len(action),
            versions=[0] * len(action),
            finish_reason="stop",
        )

    async def end_episode(self, episode_id: str) -> None:
        self._ledgers.pop(episode_id, None)


async def collect_expert_trajectories(
    env_id: str,
    tokenizer: ChatTokenizer,
    episodes: int,
    *,
    seed_start: int = 0,
    env_kwargs: dict | None = None,
    max_turns: int | None = None,
    only_successful: bool = True,
    player: str = "expert",
) -> list[Trajectory]:
    """Play `episodes` scripted episodes (seeds `seed_start`...) and return the usable ones."""
    manager = EnvManager(
        env_id,
        ScriptedTokenPolicy(tokenizer, player),
        group_size=1,
        max_concurrency=32,
        max_turns=max_turns,
        env_kwargs=env_kwargs,
    )
    async with manager:
        groups = await manager.run(range(seed_start, seed_start + episodes))
    trajectories = [t for g in groups for t in g.trajectories if t.stop_reason.finished]
    if only_successful:
        trajectories = [t for t in trajectories if t.success]
    return trajectories


@dataclass
class SFTResult:
    episodes: int
    sequences: int
    tokens: int
    steps: int
    first_loss: float
    final_loss: float


def sft_train(
    model: CausalLM,
    trajectories: list[Trajectory],
    *,
    epochs: int = 1,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    pad_id: int = 0,
) -> SFTResult:
    """Cross-entropy on the action tokens (loss mask 1) of the given trajectories, AdamW."""
    if not trajectories:
        raise InvalidArgumentError("no expert trajectories to train on")
    rows = [(t.token_ids(), t.loss_mask()) for t in trajectories]
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    for _ in range(epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = [rows[i] for i in order[start : start + batch_size]]
            longest = max(len(ids) for ids, _ in batch)
            inputs = torch.full((len(batch), longest), pad_id, dtype=torch.long)
            targets = torch.full((len(batch), longest), -100, dtype=torch.long)
            for r, (ids, mask) in enumerate(batch):
                inputs[r, : len(ids)] = torch.tensor(ids)
                labels = torch.tensor([i if m else -100 for i, m in zip(ids, mask, strict=True)])
                targets[r, : len(ids) - 1] = labels[1:]  # position t predicts token t + 1
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
    model.eval()
    return SFTResult(
        episodes=len(trajectories),
        sequences=len(rows),
        tokens=sum(sum(mask) for _, mask in rows),
        steps=len(losses),
        first_loss=losses[0],
        final_loss=sum(losses[-5:]) / len(losses[-5:]),
    )


async def warm_start(
    base_dir: str | Path,
    out_dir: str | Path,
    env_id: str,
    *,
    episodes: int,
    epochs: int = 1,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed_start: int = 0,
    env_kwargs: dict | None = None,
    max_turns: int | None = None,
    seed: int = 0,
    player: str = "expert",
    only_successful: bool = True,
) -> SFTResult:
    """Load `base_dir`, train it on `player`'s episodes, write a servable checkpoint to `out_dir`.

    `only_successful` keeps the episodes that solved the task; turn it off for a random player,
    whose successful episodes alone would teach some strategy (in GuessNumber their last guess
    agrees with every hint).
    """
    tokenizer = ChatTokenizer(base_dir)
    trajectories = await collect_expert_trajectories(
        env_id,
        tokenizer,
        episodes,
        seed_start=seed_start,
        env_kwargs=env_kwargs,
        max_turns=max_turns,
        only_successful=only_successful,
        player=player,
    )
    torch.manual_seed(seed)
    model = CausalLM.from_pretrained(base_dir)
    pad_id = tokenizer.pad_token_id or 0
    result = sft_train(
        model, trajectories, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, pad_id=pad_id
    )
    save_checkpoint_dir(model, base_dir, out_dir)
    return result


def save_checkpoint_dir(model: CausalLM, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    """Weights plus the tokenizer files of `tokenizer_dir`: a directory the server can load."""
    out = Path(out_dir)
    model.save_pretrained(out)
    copy_tokenizer_files(tokenizer_dir, out)
    return out


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> None:
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and src.resolve() != dst.resolve():
            shutil.copy2(src / name, dst / name)
