"""GuessNumber: hints, the interval variant, the binary-search expert, and the configurable range."""

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


@pytest.mark.parametrize(
    ("env_id", "lo", "hi", "turns"),
    [("games/GuessNumber-v0", 1, 10, 5), ("games/GuessNumber100-v0", 1, 100, 8)],
)
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


def _play(env, name: str, seed: int) -> tuple[list[int], list[tuple[int, int]], bool]:
    """Guesses, the interval open before each guess, and success of one reference episode."""
    env.reset(seed=seed)
    guesses, intervals = [], []
    for _ in range(env.max_turns):
        intervals.append((env.low, env.high))
        action = env.reference_action(name)
        guesses.append(int(action.removeprefix("<answer>").removesuffix("</answer>")))
        *_, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return guesses, intervals, info["success"]
    raise AssertionError("episode did not end")


def test_reference_policies_range_from_ignoring_hints_to_binary_search():
    env = agentrl.make("games/GuessNumber-v0")
    assert list(env.reference_policies) == ["random", "random_distinct", "random_in_hints", "expert"]
    wins = {name: 0 for name in env.reference_policies}
    for seed in range(300):
        for name in wins:
            guesses, intervals, success = _play(env, name, seed)
            wins[name] += success
            if name == "random_distinct":
                assert len(set(guesses)) == len(guesses)
            if name == "random_in_hints":
                assert all(lo <= g <= hi for g, (lo, hi) in zip(guesses, intervals, strict=True))
    # Analytic rates on 1-10 with 5 guesses: 1 - 0.9^5 = 41%, 5/10 = 50%, about 91%, 100%.
    assert 0.33 < wins["random"] / 300 < 0.49
    assert 0.42 < wins["random_distinct"] / 300 < 0.58
    assert 0.85 < wins["random_in_hints"] / 300 < 0.97
    assert wins["expert"] == 300
    env.close()


def test_reference_episodes_repeat_for_a_seed():
    env = agentrl.make("games/GuessNumber-v0")
    assert _play(env, "random", 5) == _play(env, "random", 5)
    env.close()


def test_unknown_reference_policy_names_the_declared_ones():
    env = agentrl.make("games/GuessNumber-v0")
    env.reset(seed=0)
    with pytest.raises(agentrl.AgentRLError, match="random_in_hints"):
        env.reference_action("oracle")
    env.close()


def test_interval_feedback_states_the_range_the_hints_leave_open():
    env = agentrl.make("games/GuessNumberInterval-v0")
    assert env.reset(seed=0)[0] == "Guess (1-10)."
    env.target = 7
    assert env.step("<answer>3</answer>")[0] == "higher (4-10)"
    assert env.step("<answer>9</answer>")[0] == "lower (4-8)"
    assert env.step("<answer>1</answer>")[0] == "higher (4-8)"  # a guess outside the range narrows nothing
    # A format error repeats the state, the range included: the last observation is still the state.
    assert env.step("seven")[0] == "No <answer>...</answer> found.\nGuess (4-8)."
    observation, reward, terminated, _, info = env.step("<answer>7</answer>")
    assert (observation, reward, terminated, info["success"]) == ("Correct!", 1.0, True, True)
    env.close()


def test_feedback_kind_is_checked():
    with pytest.raises(ValueError, match="feedback"):
        agentrl.make("games/GuessNumber-v0", feedback="range")


def test_interval_variant_keeps_the_reference_policies_and_their_rates():
    # The wording of the replies changes nothing the references do: the same episodes as
    # games/GuessNumber-v0, so the same rates (1 - 0.9^5 = 41%, 50%, about 91%, 100%).
    hint, interval = agentrl.make("games/GuessNumber-v0"), agentrl.make("games/GuessNumberInterval-v0")
    assert list(interval.reference_policies) == list(hint.reference_policies)
    wins = {name: 0 for name in interval.reference_policies}
    for seed in range(300):
        for name in wins:
            played = _play(interval, name, seed)
            assert played == _play(hint, name, seed)
            wins[name] += played[2]
    assert 0.33 < wins["random"] / 300 < 0.49
    assert 0.42 < wins["random_distinct"] / 300 < 0.58
    assert 0.85 < wins["random_in_hints"] / 300 < 0.97
    assert wins["expert"] == 300
    hint.close()
    interval.close()
