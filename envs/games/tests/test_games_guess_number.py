"""GuessNumber: hints, the binary-search expert, and the configurable range."""

from __future__ import annotations

import pytest

import agentrl


def test_hints_point_towards_the_target():
    env = agentrl.make("games/GuessNumber-v0")
    env.reset(seed=0)
    env.target = 7
    assert env.step("<answer>3</answer>")[0] == "higher"
    assert env.step("<answer> 9 </answer>")[0] == "lower"
    observation, reward, terminated, _, info = env.step("<answer>7</answer>")
    assert (observation, reward, terminated, info["success"]) == ("Correct!", 1.0, True, True)
    env.close()


@pytest.mark.parametrize(("env_id", "lo", "hi", "turns"),
                         [("games/GuessNumber-v0", 1, 10, 5), ("games/GuessNumber100-v0", 1, 100, 8)])
def test_expert_finds_every_target_within_the_turn_limit(env_id, lo, hi, turns):
    env = agentrl.make(env_id)
    assert env.max_turns == turns
    for target in range(lo, hi + 1):
        env.reset(seed=0)
        env.target = target
        for _ in range(env.max_turns):
            *_, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        assert info["success"], target
    env.close()


def test_range_is_configurable_and_checked():
    env = agentrl.make("games/GuessNumber-v0", lo=-5, hi=5)
    assert env.reset(seed=1)[0] == "Guess -5 to 5."
    assert -5 <= env.target <= 5
    assert env.step("<answer>-5</answer>")[4]["format_error"] is False
    assert env.step("<answer>five</answer>")[4]["format_error"] is True
    with pytest.raises(ValueError, match="hi"):
        agentrl.make("games/GuessNumber-v0", lo=10, hi=1)
    env.close()
