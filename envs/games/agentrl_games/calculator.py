"""Calculator: work out a long arithmetic expression, with a calculator the agent calls as a tool.

The env's one tool, `calculate(expression)`, evaluates integer arithmetic exactly (the same
whitelisted `ast` evaluator as Countdown: nothing the agent writes is executed as code). The final
answer is not a tool: it is the usual `<answer>N</answer>` text, handled by `astep`. So an episode
mixes tool turns (calls, answered with `tool` messages) and env steps (answers), which is what this
env is for: the smallest task where calling a tool is the obvious way to succeed.

Rewards (on top of the `TextGame` contract): 1.0 for the right value (terminates); a wrong value
costs a turn; a malformed tool call (bad JSON, unknown tool, wrong arguments) costs
`tool_error_penalty` (-0.1). The calculator may be used `max_tool_calls` times per episode; the call
after that ends the episode, truncated, so a model that only ever calls tools cannot loop forever.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl import EnvSpec, InvalidArgumentError
from agentrl.tools import ToolError, ToolResult, format_call, tool
from agentrl_games.base import BadAnswer, Result, TextGame
from agentrl_games.countdown import InvalidExpression, evaluate, parse_expression


class CalculatorEnv(TextGame[int]):
    """Compute `a op b op c ...` over `num_terms` numbers of up to `digits` digits.

    Observation: `Compute: 4817*2931-776*12`. Answer with `<answer>14107395</answer>`; the tool
    `calculate` is there to get the number right. Kwargs: `num_terms` (3), `digits` (4),
    `max_tool_calls` (6), `max_turns` (3 answers).
    """

    default_max_turns = 3
    system_prompt = (
        "Calculator. Compute the value of the expression you are given. You may use the calculate "
        "tool. When you know the value, reply with it like <answer>1234</answer>."
    )

    def __init__(
        self, *, num_terms: int = 3, digits: int = 4, max_tool_calls: int = 6, **kwargs: Any
    ) -> None:
        if not 2 <= num_terms <= 8 or not 1 <= digits <= 9:
            raise InvalidArgumentError(f"num_terms must be 2..8 and digits 1..9, got {num_terms}, {digits}")
        self.num_terms, self.digits, self.max_tool_calls = int(num_terms), int(digits), int(max_tool_calls)
        super().__init__(**kwargs)
        self.expression, self.value, self.tool_calls = "", 0, 0

    def new_game(self) -> str:
        rng = self.np_random
        numbers = [str(int(n)) for n in rng.integers(2, 10**self.digits, size=self.num_terms)]
        ops = [str(op) for op in rng.choice(["+", "-", "*"], size=self.num_terms - 1)]
        self.expression = numbers[0] + "".join(op + n for op, n in zip(ops, numbers[1:], strict=True))
        self.value = int(evaluate(parse_expression(self.expression)))
        self.tool_calls = 0
        return self.render_state()

    def render_state(self) -> str:
        return f"Compute: {self.expression}"

    def parse_move(self, text: str) -> int:
        try:
            return int(text.replace(",", "").strip())
        except ValueError as exc:
            raise BadAnswer("Answer with an integer, like <answer>1234</answer>.") from exc

    def play(self, move: int) -> Result:
        if move == self.value:
            return Result("Correct!", success=True)
        return Result(f"{move} is not the value of {self.expression}.")

    @tool
    async def calculate(self, expression: str) -> str | ToolResult:
        """Evaluate an arithmetic expression exactly (integers, + - * / and parentheses)."""
        self.tool_calls += 1
        if self.tool_calls > self.max_tool_calls:
            message = (
                f"The calculator may be used {self.max_tool_calls} times per episode; the episode is over."
            )
            return ToolResult(message, truncated=True, info={"success": False})
        try:
            value = evaluate(parse_expression(expression))
        except (BadAnswer, InvalidExpression) as exc:
            raise ToolError(str(exc)) from exc
        return str(value.numerator) if value.denominator == 1 else f"{value} (= {float(value):.6g})"

    def expert_action(self) -> str:
        """Call the calculator once, then answer with what it said."""
        if self.tool_calls == 0:
            return format_call("calculate", {"expression": self.expression})
        return super().expert_action()

    def expert_move(self) -> str:
        return str(self.value)

    def random_move(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(0, 10 ** (self.digits * 2))))


CALCULATOR = EnvSpec(
    id="games/Calculator-v0",
    entry_point=CalculatorEnv,
    kwargs={"num_terms": 3, "digits": 4},
    description="Compute a 3-term expression of 4-digit numbers; a calculate tool is offered.",
)
