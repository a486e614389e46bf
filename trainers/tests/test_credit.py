"""Multi-turn credit assignment against hand-computed values, and its path to the tokens."""

import numpy as np
import pytest
from agentrl_trainers.advantages import reward_to_go, turn_group_advantages, turn_return_advantages
from agentrl_trainers.batching import build_samples, turn_advantages, turn_states

from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn


def test_reward_to_go_sums_what_followed_each_turn_discounted():
    np.testing.assert_allclose(reward_to_go([0.0, -0.1, 1.0]), [0.9, 0.9, 1.0])
    # gamma 0.5: G_2 = 1, G_1 = -0.1 + 0.5 = 0.4, G_0 = 0 + 0.2 = 0.2
    np.testing.assert_allclose(reward_to_go([0.0, -0.1, 1.0], gamma=0.5), [0.2, 0.4, 1.0])


def test_turn_return_subtracts_the_groups_mean_at_each_turn_index():
    # episode a: rewards [0, 1] -> G = [1, 1]; episode b: [0, 0, 0] -> G = [0, 0, 0]
    # baselines: t0 (a, b) 0.5, t1 (a, b) 0.5, t2 (b only) 0
    # centred: a [0.5, 0.5], b [-0.5, -0.5, 0]; std over the 5 values = sqrt(1/5)
    (group,) = turn_return_advantages([[[0.0, 1.0], [0.0, 0.0, 0.0]]])
    s = np.sqrt(0.2)
    np.testing.assert_allclose(group[0], [0.5 / s, 0.5 / s], rtol=1e-5)
    np.testing.assert_allclose(group[1], [-0.5 / s, -0.5 / s, 0.0], rtol=1e-5, atol=1e-9)


def test_turn_return_judges_a_turn_by_what_followed_it():
    # gamma 0.5: a solves at turn 0 (G = [1]); b at turn 1 (G = [0.5, 1]).
    # t0 baseline 0.75 -> a +0.25, b -0.25; t1: only b -> 0. std of [.25, -.25, 0] = sqrt(1/24)
    (group,) = turn_return_advantages([[[1.0], [0.0, 1.0]]], gamma=0.5)
    s = np.sqrt(0.125 / 3)
    np.testing.assert_allclose(group[0], [0.25 / s], rtol=1e-5)
    np.testing.assert_allclose(group[1], [-0.25 / s, 0.0], rtol=1e-5, atol=1e-9)


def test_turn_return_of_a_group_with_equal_turns_is_zero():
    (group,) = turn_return_advantages([[[0.0, 1.0], [0.0, 1.0]]])
    np.testing.assert_allclose(np.concatenate(group), 0.0, atol=0)


def test_turn_group_adds_a_baseline_among_turns_from_the_same_state():
    # Three episodes of one seed. Turn 0 shares state "s"; a and b then reach state "x", c "y".
    #   a: rewards [0, 1]  G = [1, 1]   R = 1
    #   b: rewards [0, 0]  G = [0, 0]   R = 0
    #   c: rewards [0, 1]  G = [1, 1]   R = 1
    # episode GRPO: mean 2/3, std sqrt(2)/3 -> a, c: +1/sqrt(2); b: -sqrt(2)
    # step, state s {1, 0, 1}: same numbers as GRPO; state x {a: 1, b: 0} -> +1, -1; y alone -> 0
    rewards = [[[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]]
    states = [[["s", "x"], ["s", "x"], ["s", "y"]]]
    (group,) = turn_group_advantages(rewards, states, step_weight=0.5)
    hi, lo = 1 / np.sqrt(2), -np.sqrt(2)
    np.testing.assert_allclose(group[0], [hi + 0.5 * hi, hi + 0.5 * 1], rtol=1e-5)
    np.testing.assert_allclose(group[1], [lo + 0.5 * lo, lo - 0.5 * 1], rtol=1e-5)
    np.testing.assert_allclose(group[2], [hi + 0.5 * hi, hi + 0.0], rtol=1e-5)


def test_turn_group_with_discount_prefers_the_faster_solution_from_one_state():
    # Both succeed (R = 1 each, episode advantage 0); from the shared first state a solved at once
    # (G = 1), b one turn later (G = 0.9): step advantages +1 / -1. b's second turn is alone -> 0.
    (group,) = turn_group_advantages([[[1.0], [0.0, 1.0]]], [[["s"], ["s", "t"]]], gamma=0.9)
    np.testing.assert_allclose(group[0], [1.0], rtol=1e-4)  # std 0.05: the 1e-6 epsilon shows
    np.testing.assert_allclose(group[1], [-1.0, 0.0], rtol=1e-4, atol=1e-9)


def test_turn_group_rejects_states_that_do_not_match_the_turns():
    with pytest.raises(ValueError, match="states"):
        turn_group_advantages([[[0.0, 1.0]]], [[["s"]]])


def _trajectory(name: str, turns: list[tuple[str, str, float, int, int]]) -> Trajectory:
    """turns: (observation, action, reward, prompt tokens, action tokens)."""
    built = [
        Turn(obs, act, reward, {}, [7] * n_prompt, [5] * n_action, [-1.0] * n_action, [0] * n_action)
        for obs, act, reward, n_prompt, n_action in turns
    ]
    return Trajectory(name, "env", "g", 0, turns=built, stop_reason=StopReason.TERMINATED)


def _guess_group() -> TrajectoryGroup:
    # a: guesses 5 (higher), then 8: solved. b: guesses 3 (higher), then 2: fails.
    a = _trajectory("a", [("Guess", "5", 0.0, 3, 2), ("higher", "8", 1.0, 1, 2)])
    b = _trajectory("b", [("Guess", "3", 0.0, 3, 2), ("higher", "2", 0.0, 1, 2)])
    return TrajectoryGroup("g", 0, [a, b])


def test_turn_states_are_the_conversation_up_to_each_observation():
    a = _guess_group().trajectories[0]
    assert turn_states(a) == [("Guess",), ("Guess", "5", "higher")]


def test_observation_state_key_matches_turns_that_reached_one_observation_by_different_paths():
    # GuessNumberInterval, target 8. a: 5 -> "higher (6-10)" -> 8 solved. b: 3 -> "higher (4-10)"
    # -> 5 -> "higher (6-10)" -> 7: fails. c: 5 -> "higher (6-10)" -> 9: fails (3 turns max).
    a = _trajectory("a", [("Guess (1-10).", "5", 0.0, 3, 2), ("higher (6-10)", "8", 1.0, 1, 2)])
    opening = ("Guess (1-10).", "3", 0.0, 3, 2)
    b = _trajectory("b", [opening, ("higher (4-10)", "5", 0.0, 1, 2), ("higher (6-10)", "7", 0.0, 1, 2)])
    c = _trajectory("c", [("Guess (1-10).", "5", 0.0, 3, 2), ("higher (6-10)", "9", 0.0, 1, 2)])
    assert turn_states(b, "observation") == [("Guess (1-10).",), ("higher (4-10)",), ("higher (6-10)",)]
    group = TrajectoryGroup("g", 0, [a, b, c])
    # Episode GRPO on R = (1, 0, 0): mean 1/3, std sqrt(2)/3 -> a +sqrt(2), b and c -1/sqrt(2).
    # Step term (gamma 1, w 1), by observation: "Guess (1-10)." {a 1, b 0, c 0} -> the same numbers;
    # "higher (6-10)" {a 1 (turn 1), b 0 (turn 2), c 0 (turn 1)} -> the same again; "higher
    # (4-10)" only b -> 0.
    hi, lo = np.sqrt(2), -1 / np.sqrt(2)
    ((adv_a, adv_b, adv_c),) = turn_advantages([group], "grpo", "turn_group", turn_state="observation")
    np.testing.assert_allclose(adv_a, [2 * hi, 2 * hi], rtol=1e-5)
    np.testing.assert_allclose(adv_b, [2 * lo, lo, 2 * lo], rtol=1e-5)
    np.testing.assert_allclose(adv_c, [2 * lo, 2 * lo], rtol=1e-5)
    # Keyed by history, b's last turn has no partner (3 came first), so its step term is 0; a and c
    # share "5, higher (6-10)": returns 1 and 0 -> +1 / -1.
    ((adv_a, adv_b, adv_c),) = turn_advantages([group], "grpo", "turn_group", turn_state="history")
    np.testing.assert_allclose(adv_a, [2 * hi, hi + 1], rtol=1e-5)
    np.testing.assert_allclose(adv_b, [2 * lo, lo, lo], rtol=1e-5)
    np.testing.assert_allclose(adv_c, [2 * lo, lo - 1], rtol=1e-5)


def test_unknown_turn_state_key_names_the_allowed_ones():
    with pytest.raises(ValueError, match="observation"):
        turn_states(_guess_group().trajectories[0], "last")  # type: ignore[arg-type]


def test_each_turns_tokens_carry_that_turns_advantage():
    # Episode level: GRPO +1 / -1 on every sampled token.
    (sa, sb) = build_samples([_guess_group()], "grpo", "episode")
    np.testing.assert_allclose(sa.advantages, [0, 0, 0, 1, 1, 0, 1, 1], rtol=1e-5)
    np.testing.assert_allclose(sb.advantages, [0, 0, 0, -1, -1, 0, -1, -1], rtol=1e-5)
    # turn_group: the first turns share the state ("Guess",) with returns 1 and 0 -> step +1 / -1;
    # the second turns come from different histories (5 vs 3 before "higher") -> step 0.
    (sa, sb) = build_samples([_guess_group()], "grpo", "turn_group", turn_group_weight=1.0)
    np.testing.assert_allclose(sa.advantages, [0, 0, 0, 2, 2, 0, 1, 1], rtol=1e-5)
    np.testing.assert_allclose(sb.advantages, [0, 0, 0, -2, -2, 0, -1, -1], rtol=1e-5)
    # turn_return: G a [1, 1], b [0, 0]; baselines 0.5, 0.5; centred +-0.5, std 0.5 -> +-1.
    (sa, sb) = build_samples([_guess_group()], "grpo", "turn_return")
    np.testing.assert_allclose(sa.advantages, [0, 0, 0, 1, 1, 0, 1, 1], rtol=1e-5)
    np.testing.assert_allclose(sb.advantages, [0, 0, 0, -1, -1, 0, -1, -1], rtol=1e-5)


def test_unknown_credit_assignment_names_the_allowed_ones():
    with pytest.raises(ValueError, match="turn_group"):
        turn_advantages([_guess_group()], "grpo", "per_token")  # type: ignore[arg-type]
