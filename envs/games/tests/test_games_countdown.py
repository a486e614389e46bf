"""Countdown: safe expression checking, the rules on numbers, generation and the solver."""

from __future__ import annotations

from fractions import Fraction

import pytest
from agentrl_games.base import BadAnswer
from agentrl_games.countdown import evaluate, parse_expression, solve

import agentrl


@pytest.fixture
def env():
    env = agentrl.make("games/Countdown-v0", max_turns=10)
    env.reset(seed=0)
    env.numbers, env.target = (3, 5, 7), 22  # a fixed puzzle, so the cases below are hand-checked
    yield env
    env.close()


def step(env, expression: str):
    return env.step(f"<answer>{expression}</answer>")


@pytest.mark.parametrize("expression", ["3*5+7", "(5 × 3) + 7", "7+3*5 = 22", "7 + 5*3"])
def test_correct_expressions_succeed(env, expression):
    _, reward, terminated, _, info = step(env, expression)
    assert (reward, terminated, info["success"]) == (1.0, True, True)


@pytest.mark.parametrize(
    ("expression", "why"),
    [("3*5+8", "8 not available"), ("3*5+7+7", "7 not available"), ("5*5-3", "5 not available")],
)
def test_numbers_not_given_or_reused_are_invalid(env, expression, why):
    observation, reward, terminated, _, info = step(env, expression)
    assert why in observation
    assert info["invalid"] and not info["format_error"] and not terminated
    assert reward == 0.0


def test_wrong_value_gets_feedback_and_another_try(env):
    observation, reward, terminated, truncated, _ = step(env, "3+5+7")
    assert observation == "That makes 15, not 22."
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert step(env, "7+3*5")[2]


def test_division_by_zero_is_invalid_not_a_crash(env):
    env.numbers = (5, 5, 7)
    observation, *_ = step(env, "7/(5-5)")
    assert "division by zero" in observation


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd').read()",
        "(3).__class__",
        "3**5",
        "-3+5",
        "3 if 5 else 7",
        "[3, 5]",
        "3.5*2",
        "True+7",
        "'3'+'5'",
        "lambda: 3",
        "3 // 5",
        "3 % 5",
        "x + 1",
        "3 << 5",
        "(" * 101 + "3" + ")" * 101,  # over the length limit
    ],
)
def test_non_arithmetic_code_is_a_format_error(env, expression):
    _, reward, terminated, _, info = step(env, expression)
    assert info["format_error"] and reward == pytest.approx(-0.1) and not terminated
    with pytest.raises(BadAnswer):
        parse_expression(expression)


def test_evaluation_is_exact():
    assert evaluate(parse_expression("(1/3)*3")) == Fraction(1)
    assert evaluate(parse_expression("7/2")) == Fraction(7, 2)


@pytest.mark.parametrize("env_id", ["games/Countdown-v0", "games/Countdown4-v0"])
def test_generated_instances_are_solvable_and_in_range(env_id):
    env = agentrl.make(env_id)
    for seed in range(30):
        env.reset(seed=seed)
        assert len(env.numbers) == env.num_numbers
        assert all(1 <= n <= env.max_number for n in env.numbers)
        assert 2 <= env.target <= env.max_target and env.target not in env.numbers
        solution = solve(tuple(sorted(env.numbers)), env.target)
        assert solution is not None
        tree = parse_expression(solution)
        assert evaluate(tree) == env.target
    env.close()


def test_solver_reports_impossible_targets():
    assert solve((1, 1, 1), 100) is None
    assert solve((2, 3), 6) == "2*3"
