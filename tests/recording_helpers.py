"""A deterministic trajectory shared by the recording and viewer tests."""

from __future__ import annotations

from agentrl.trajectory import StopReason, Trajectory, Turn


def make_trajectory(index: int, turns: int = 3) -> Trajectory:
    """A deterministic episode whose every field depends on `index`, so a read-back can be checked."""
    return Trajectory(
        episode_id=f"g{index}-e0",
        env_id="games/GuessNumber-v0",
        group_id=f"g{index}",
        seed=index,
        system_prompt="Guess the number.",
        turns=[
            Turn(
                observation=f"obs {index}.{k} ✓",
                action=f"guess {k}",
                reward=0.25 * k - index,
                info={"success": k == turns - 1, "tool_calls": [{"name": "calc", "arguments": {"x": k}}]},
                prompt_token_ids=[(index * 7 + k + j) % 50_000 for j in range(20 + k)],
                action_token_ids=[100_000 + index + j for j in range(5)],
                action_logprobs=[-0.1 * (j + 1) - 1e-9 * index for j in range(5)],
                action_versions=[index % 3] * 5,
                finish_reason="stop",
                policy_seconds=0.01 * k,
                env_seconds=0.002,
            )
            for k in range(turns)
        ],
        stop_reason=[StopReason.TERMINATED, StopReason.TRUNCATED, StopReason.TIMEOUT][index % 3],
        started_at=1000.0 + index,
        finished_at=1001.5 + index,
        info={"index": index},
    )
