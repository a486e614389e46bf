"""NumberLine: relative moves, replies from where the position lands, the expert, the references."""

from __future__ import annotations

import pytest

import agentrl


def _steps(env, name: str, seed: int) -> tuple[list[int], list[str], bool]:
    """Steps, the reply each one answered, and success of one reference episode."""
    observation, _ = env.reset(seed=seed)
    steps, replies = [], []
    for _ in range(env.max_turns):
        action = env.reference_action(name)
        steps.append(int(action.removeprefix("<answer>").removesuffix("</answer>")))
        replies.append(observation.split()[0])
        observation, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return steps, replies, info["success"]
    raise AssertionError("episode did not end")


def test_replies_say_which_side_of_the_new_position_the_number_is():
    env = agentrl.make("games/NumberLine-v0")
    env.reset(seed=0)
    env.target, env.position = 7, 5
    assert env.step("<answer>+1</answer>")[0] == "higher (position 6)"
    assert env.step("<answer>+3</answer>")[0] == "lower (position 9)"
    assert env.step("<answer>4</answer>")[0] == "lower (position 9)"  # stops at the end of the line
    observation, reward, terminated, _, info = env.step("<answer>-2</answer>")
    assert (observation, reward, terminated, info["success"]) == ("Correct!", 1.0, True, True)
    env.close()


@pytest.mark.parametrize("answer", ["0", "+5", "-12", "2.5", "two", "+ 2"])
def test_a_step_that_is_not_a_legal_move_is_a_format_error_and_moves_nothing(answer):
    env = agentrl.make("games/NumberLine-v0")
    first, _ = env.reset(seed=3)
    observation, reward, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert info["format_error"] is True and reward == -0.1
    assert (terminated, truncated, env.position, env.turn) == (False, False, 5, 1)
    assert observation.endswith(first)  # the state is repeated after the reason
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "turns"),
    [({}, 4), ({"lo": 1, "hi": 15}, 4), ({"lo": 0, "hi": 20, "start": 3}, 6), ({"hi": 9, "max_step": 1}, 4)],
)
def test_expert_finds_every_number_within_the_turn_limit(kwargs, turns):
    env = agentrl.make("games/NumberLine-v0", **kwargs)
    assert env.max_turns == turns
    for target in range(env.lo, env.hi + 1):
        if target == env.start:
            continue
        env.reset(seed=0)
        env.target, env.low, env.high = target, env.lo, env.hi
        env._narrow()
        for _ in range(env.max_turns):
            *_, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        # A single-step walker cannot binary search: with max_step 1 the expert only walks.
        assert info["success"] or kwargs.get("max_step") == 1, target
    env.close()


def test_the_number_is_never_where_the_position_starts():
    env = agentrl.make("games/NumberLine-v0")
    targets = set()
    for seed in range(200):
        env.reset(seed=seed)
        targets.add(env.target)
    assert targets == {1, 2, 3, 4, 6, 7, 8, 9}
    env.close()


def test_reference_policies_range_from_ignoring_replies_to_binary_search():
    env = agentrl.make("games/NumberLine-v0")
    assert list(env.reference_policies) == ["random", "random_toward_hint", "expert"]
    wins = dict.fromkeys(env.reference_policies, 0)
    for seed in range(300):
        for name in wins:
            steps, replies, success = _steps(env, name, seed)
            wins[name] += success
            if name == "random_toward_hint":
                assert all((s > 0) == (r == "higher") for s, r in zip(steps, replies, strict=True))
    # Simulated rates (20,000 episodes) on 1-9 from 5, steps up to 4, 4 moves: 35%, 76%, 100%.
    assert 0.26 < wins["random"] / 300 < 0.45
    assert 0.67 < wins["random_toward_hint"] / 300 < 0.86
    assert wins["expert"] == 300
    env.close()


def test_random_reference_moves_do_not_depend_on_the_number():
    env = agentrl.make("games/NumberLine-v0")
    for seed in range(20):
        played = []
        for target in (1, 9):
            env.reset(seed=seed)
            env.target, env.low, env.high = target, env.lo, env.hi
            steps = []
            for _ in range(env.max_turns):
                action = env.reference_action("random")
                steps.append(action)
                *_, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    break
            played.append(steps)
        shared = min(len(played[0]), len(played[1]))
        assert played[0][:shared] == played[1][:shared]
    env.close()


def test_line_settings_are_checked():
    with pytest.raises(ValueError, match="hi"):
        agentrl.make("games/NumberLine-v0", lo=3, hi=3)
    with pytest.raises(ValueError, match="start"):
        agentrl.make("games/NumberLine-v0", start=12)
    with pytest.raises(ValueError, match="max_step"):
        agentrl.make("games/NumberLine-v0", max_step=0)
