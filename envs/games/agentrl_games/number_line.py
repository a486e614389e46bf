"""NumberLine: find a hidden integer by moving along a line, told after each move which way it lies.

GuessNumber with relative moves. The agent does not name a number; it moves its position by a
step (`+2`, `-1`) and the env answers "higher" or "lower" from where the position landed. What each
reply asks for is then the same whatever came before: step the way the last reply points, and
shorter each turn. A policy that reads the replies plays that; one that ignores them walks at
random.

Why it exists beside GuessNumber: on GuessNumber, using a reply means comparing numbers (the
guess it refers to, the bounds earlier replies set), and a 1M-parameter model built from scratch
does not learn to read numbers from its context within a CPU budget (`bench/feedback_probe.py`
measures it: after 512 supervised steps on play that follows the replies, its next guess lands in
the stated range no more often than the reply's word alone allows). Here the reply's word alone
says which way to move, so what is learned is the multi-turn skill itself: act on what the
environment said, turn after turn. A model that gets
this has learned to use feedback; a model that does not stays at the `random` reference.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

import numpy as np

from agentrl import EnvSpec, InvalidArgumentError
from agentrl_games.base import BadAnswer, Result, TextGame

_STEP = re.compile(r"[+-]?\d{1,3}")


class NumberLineEnv(TextGame[int]):
    """Find a hidden integer in [lo, hi] from a position that starts at `start` (the middle by
    default, never on the number) and moves by a step from -max_step to +max_step per turn.

    A move stops at the ends of the line (a step past an end lands on it), and the env replies
    "higher (position 7)" or "lower (position 7)", the word saying which side of the new
    position the number lies on.

    Rewards: 1.0 when the position lands on the number (terminates); `format_penalty` (-0.1) for an
    answer that is not a step in range (zero included: it would not move); `-step_cost` (0 by
    default) for any other move. Truncated after `max_turns` moves, by default the binary-search
    worst case plus one, so the expert always succeeds.

    Reference policies (1-9 from 5, steps up to 4, 4 moves: about 35%, 76%, 100%): "random" never
    reads a reply, "random_toward_hint" steps a random distance the way the last reply points (the
    feedback used, no strategy), "expert" halves the interval the replies leave open.
    """

    reference_policies: ClassVar[dict[str, str]] = {
        "random": "a random step in the right format, ignores every reply",
        "random_toward_hint": "a random-sized step the way the last reply points",
        "expert": "binary search: to the middle of what the replies leave open",
    }

    def __init__(
        self,
        *,
        lo: int = 1,
        hi: int = 9,
        start: int | None = None,
        max_step: int | None = None,
        max_turns: int | None = None,
        **kwargs: Any,
    ) -> None:
        if hi - lo < 1:
            raise InvalidArgumentError(f"hi ({hi}) must be at least lo + 1 ({lo + 1})")
        self.lo, self.hi = int(lo), int(hi)
        self.start = (self.lo + self.hi) // 2 if start is None else int(start)
        if not self.lo <= self.start <= self.hi:
            raise InvalidArgumentError(f"start ({start}) must lie in [{lo}, {hi}]")
        self.max_step = max(1, (self.hi - self.lo) // 2) if max_step is None else int(max_step)
        if self.max_step < 1:
            raise InvalidArgumentError(f"max_step must be >= 1, got {max_step}")
        self.system_prompt = (
            f"I am thinking of an integer from {self.lo} to {self.hi}. Your position starts at "
            f"{self.start}. Move with a step from -{self.max_step} to +{self.max_step}, like "
            "<answer>+2</answer> or <answer>-1</answer>. After each move I say higher (the number "
            "is bigger than your position) or lower (it is smaller). You win when your position "
            "is the number."
        )
        worst_case = math.ceil(math.log2(max(self.start - self.lo, self.hi - self.start) + 1))
        super().__init__(max_turns=worst_case + 1 if max_turns is None else max_turns, **kwargs)

    def new_game(self) -> str:
        others = [n for n in range(self.lo, self.hi + 1) if n != self.start]
        self.target = int(self.np_random.choice(others))
        self.position = self.start
        self.low, self.high = self.lo, self.hi  # what the replies so far leave open
        self._narrow()
        return self.render_state()

    def parse_move(self, text: str) -> int:
        if not _STEP.fullmatch(text):
            raise BadAnswer(f"Answer with a step like +2 or -1 (from -{self.max_step} to +{self.max_step}).")
        step = int(text)
        if step == 0 or abs(step) > self.max_step:
            raise BadAnswer(f"The step must be from -{self.max_step} to +{self.max_step} and not 0.")
        return step

    def play(self, move: int) -> Result:
        self.position = min(self.hi, max(self.lo, self.position + move))
        if self.position == self.target:
            return Result("Correct!", success=True)
        self._narrow()
        return Result(self.render_state())

    def _narrow(self) -> None:
        if self.target > self.position:
            self.low = max(self.low, self.position + 1)
        else:
            self.high = min(self.high, self.position - 1)

    def _hint(self) -> str:
        return "higher" if self.target > self.position else "lower"

    def render_state(self) -> str:
        return f"{self._hint()} (position {self.position})"

    def _step_text(self, step: int) -> str:
        return f"{step:+d}"

    def expert_move(self) -> str:
        step = (self.low + self.high) // 2 - self.position
        return self._step_text(max(-self.max_step, min(self.max_step, step)))

    def random_move(self, rng: np.random.Generator) -> str:
        size = int(rng.integers(1, self.max_step + 1))
        return self._step_text(size if rng.random() < 0.5 else -size)

    def reference_move(self, name: str, rng: np.random.Generator) -> str:
        if name == "random_toward_hint":
            size = int(rng.integers(1, self.max_step + 1))
            return self._step_text(size if self.target > self.position else -size)
        return super().reference_move(name, rng)


NUMBER_LINE = EnvSpec(
    id="games/NumberLine-v0",
    entry_point=NumberLineEnv,
    kwargs={"lo": 1, "hi": 9},
    description="Find an integer in 1-9 by moving from 5 in steps of up to 4, told higher/lower (4 moves).",
)
