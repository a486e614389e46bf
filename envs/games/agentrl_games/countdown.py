"""Countdown: combine the given numbers with + - * / to hit a target.

Instances are built backwards from a random expression over the drawn numbers, so each one has
a solution. Answers are parsed with `ast` and only a whitelist of node types (integer literals,
the four operators, parentheses) is evaluated, with exact fractions: nothing the agent writes is
ever executed as code.
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np

from agentrl import AgentRLError, EnvSpec, InvalidArgumentError
from agentrl_games.base import BadAnswer, Result, TextGame

_MAX_EXPRESSION_CHARS = 200
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_UNICODE_OPERATORS = str.maketrans({"×": "*", "÷": "/", "−": "-", "x": "*", "X": "*"})


class InvalidExpression(ValueError):
    """The expression parsed but cannot be scored (division by zero, a number not given)."""


def parse_expression(text: str) -> ast.expr:
    """The syntax tree of an arithmetic expression, or `BadAnswer` for anything else.

    Accepts `×`/`x`/`÷` for `*`/`/` and ignores a trailing `= N`, which models like to add.
    """
    text = text.translate(_UNICODE_OPERATORS).split("=")[0].strip()
    if not text or len(text) > _MAX_EXPRESSION_CHARS:
        raise BadAnswer(f"Answer with an arithmetic expression (at most {_MAX_EXPRESSION_CHARS} characters).")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise BadAnswer("Answer with an arithmetic expression like (3+5)*2.") from exc
    for node in ast.walk(tree):
        allowed = isinstance(node, ast.BinOp | ast.operator) and type(getattr(node, "op", node)) in _OPERATORS
        literal = isinstance(node, ast.Constant) and type(node.value) is int
        if not (allowed or literal):
            raise BadAnswer("Use only the given numbers, + - * / and parentheses.")
    return tree


def numbers_used(tree: ast.expr) -> Counter[int]:
    constants = (node for node in ast.walk(tree) if isinstance(node, ast.Constant))
    return Counter(node.value for node in constants if isinstance(node.value, int))


def evaluate(tree: ast.expr) -> Fraction:
    """Exact value of a tree accepted by `parse_expression`."""
    if isinstance(tree, ast.Constant) and isinstance(tree.value, int):
        return Fraction(tree.value)
    assert isinstance(tree, ast.BinOp)
    left, right = evaluate(tree.left), evaluate(tree.right)
    op = type(tree.op)
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    if right == 0:
        raise InvalidExpression("division by zero")
    return left / right


@functools.cache
def solve(numbers: tuple[int, ...], target: int) -> str | None:
    """An expression using each of `numbers` at most once that equals `target`, or None.

    Depth-first search: combine any two items with any operator into one, recurse, and remember
    the multisets of values already shown to fail. The result is printed with minimal brackets.
    """
    failed: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        for value, text in items:
            if value == target:
                return text
        key = tuple(sorted(value for value, _ in items))
        if len(items) < 2 or key in failed:
            return None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                (a, ta), (b, tb) = items[i], items[j]
                rest = [item for k, item in enumerate(items) if k not in (i, j)]
                options = [
                    (a + b, f"({ta}+{tb})"),
                    (a * b, f"({ta}*{tb})"),
                    (a - b, f"({ta}-{tb})"),
                    (b - a, f"({tb}-{ta})"),
                ]
                if b != 0:
                    options.append((a / b, f"({ta}/{tb})"))
                if a != 0:
                    options.append((b / a, f"({tb}/{ta})"))
                for option in options:
                    found = search([*rest, option])
                    if found is not None:
                        return found
        failed.add(key)
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    return None if found is None else ast.unparse(ast.parse(found, mode="eval")).replace(" ", "")


class CountdownEnv(TextGame[ast.expr]):
    """Write an expression that equals the target, using each given number at most once.

    Observation: `Numbers: 3 7 8 2\\nTarget: 29`. The answer is an expression such as
    `<answer>(8-3)*7-2*3</answer>`; intermediate results may be fractions. A wrong but
    well-formed answer gets feedback (its value, or why it is invalid: a number not given or used
    too often, division by zero) and the agent tries again until `max_turns`.
    Rewards: 1.0 for a correct expression (terminates); `format_penalty` (-0.1) for text that is
    not an arithmetic expression (names, calls, powers, anything but integers, + - * / and
    parentheses); `-step_cost` (0 by default) for a wrong or invalid expression.

    Kwargs: `num_numbers` (how many numbers are given), `max_number` (numbers are drawn from
    1..max_number), `max_target` (targets are positive integers up to this), `max_turns` (4).
    """

    default_max_turns = 4

    def __init__(
        self, *, num_numbers: int = 3, max_number: int = 10, max_target: int = 100, **kwargs: Any
    ) -> None:
        if not 2 <= num_numbers <= 6:
            raise InvalidArgumentError(f"num_numbers must be between 2 and 6, got {num_numbers}")
        if max_number < 2 or max_target < 2:
            got = f"{max_number}, {max_target}"
            raise InvalidArgumentError(f"max_number and max_target must be >= 2, got {got}")
        self.num_numbers, self.max_number = int(num_numbers), int(max_number)
        self.max_target = int(max_target)
        super().__init__(**kwargs)
        self.system_prompt = (
            "Countdown. Use the given numbers with + - * / and parentheses to make the target. "
            "Use each number at most once; you need not use them all. "
            "Reply with the expression like <answer>(3+5)*2</answer>."
        )

    def new_game(self) -> str:
        rng = self.np_random
        while True:
            numbers = [int(n) for n in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
            value = self._random_value(numbers, rng)
            if (
                value is not None
                and value.denominator == 1
                and 2 <= value <= self.max_target
                and value not in numbers
            ):
                break
        self.numbers, self.target = tuple(numbers), int(value)
        return self.render_state()

    @staticmethod
    def _random_value(numbers: list[int], rng: np.random.Generator) -> Fraction | None:
        """The value of a random expression over all of `numbers` (None on division by zero)."""
        values = [Fraction(n) for n in numbers]
        while len(values) > 1:
            i, j = (int(k) for k in rng.choice(len(values), size=2, replace=False))
            a, b = values[i], values[j]
            op = int(rng.integers(4))
            if op == 3 and b == 0:
                return None
            combined = (a + b, a - b, a * b, a / b if b else a)[op]
            values = [v for k, v in enumerate(values) if k not in (i, j)] + [combined]
        return values[0]

    def parse_move(self, text: str) -> ast.expr:
        return parse_expression(text)

    def play(self, move: ast.expr) -> Result:
        extra = numbers_used(move) - Counter(self.numbers)
        if extra:
            bad = ", ".join(str(n) for n in sorted(extra))
            return Result(
                f"Invalid: {bad} not available. Numbers: {self._numbers_text()}", info={"invalid": True}
            )
        try:
            value = evaluate(move)
        except InvalidExpression as exc:
            return Result(f"Invalid: {exc}.", info={"invalid": True})
        if value == self.target:
            return Result("Correct!", success=True)
        shown = str(value.numerator) if value.denominator == 1 else f"{float(value):.3g}"
        return Result(f"That makes {shown}, not {self.target}.")

    def render_state(self) -> str:
        return f"Numbers: {self._numbers_text()}\nTarget: {self.target}"

    def _numbers_text(self) -> str:
        return " ".join(str(n) for n in self.numbers)

    def expert_move(self) -> str:
        solution = solve(tuple(sorted(self.numbers)), self.target)
        if solution is None:  # pragma: no cover - generation guarantees a solution exists
            raise AgentRLError(f"no solution for {self.numbers} -> {self.target}")
        return solution

    def random_move(self, rng: np.random.Generator) -> str:
        count = int(rng.integers(2, len(self.numbers) + 1))
        picked = [str(n) for n in rng.permutation(self.numbers)[:count]]
        ops = rng.choice(list(_OPERATORS.values()), size=count - 1)
        return picked[0] + "".join(f"{op}{n}" for op, n in zip(ops, picked[1:], strict=True))


COUNTDOWN = EnvSpec(
    id="games/Countdown-v0",
    entry_point=CountdownEnv,
    kwargs={"num_numbers": 3, "max_number": 10, "max_target": 100},
    description="Make the target from 3 numbers (1-10) with + - * /, 4 tries.",
)
COUNTDOWN_4 = EnvSpec(
    id="games/Countdown4-v0",
    entry_point=CountdownEnv,
    kwargs={"num_numbers": 4, "max_number": 25, "max_target": 200},
    description="Make the target from 4 numbers (1-25) with + - * /, 4 tries.",
)
