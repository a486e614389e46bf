"""GuessNumber: find a hidden integer from "higher"/"lower" hints.

The cheapest game of the suite: observations are one or two words, so a tiny model sees most of
its tokens in its own moves, and the optimal strategy (binary search) is learnable from the
feedback alone. It is meant as the first task a freshly built model trains on.

Two kinds of feedback (`feedback=`):

- "hint" (games/GuessNumber-v0): the reply is "higher" or "lower". Using it needs the guess it
  refers to and every earlier hint, so the right move is a function of the whole conversation.
- "interval" (games/GuessNumberInterval-v0): the reply also states what the hints so far imply,
  "higher (6-10)": the range the number is still in. Each observation is then the game's state
  (a Markov observation), so a policy that reads only the last reply can guess within the hints
  or binary search, while one that ignores it is still the 41% random guesser. It stays
  multi-turn: the right guess at each turn depends on what the env replied to the turn before,
  and the turn-level group baseline can compare turns by observation
  (`learner.turn_state: observation`), since equal observations of one seed are equal states.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar, Literal

import numpy as np

from agentrl import EnvSpec, InvalidArgumentError
from agentrl_games.base import BadAnswer, Result, TextGame

_INTEGER = re.compile(r"[+-]?\d{1,18}")

Feedback = Literal["hint", "interval"]
FEEDBACK_KINDS: tuple[Feedback, ...] = ("hint", "interval")


class GuessNumberEnv(TextGame[int]):
    """Guess a hidden integer in [lo, hi]; after each wrong guess the env says "higher" or "lower"
    (with `feedback="interval"` followed by the range still open, "higher (6-10)").

    Rewards: 1.0 for the correct guess (terminates); `format_penalty` (-0.1) when the answer is not
    an integer; `-step_cost` (0 by default) for a wrong guess. A guess outside [lo, hi] is a legal
    (wasted) guess and gets the same higher/lower hint. Truncated after `max_turns` guesses,
    which defaults to the binary-search worst case plus one, so the expert always succeeds.

    Reference policies, from floor to ceiling (1-10, 5 turns: about 41%, 50%, 91%, 100%): "random"
    and "random_distinct" never read a hint, so a model must beat them to show it uses the env's
    feedback; "random_in_hints" reads the hints but has no strategy; "expert" is binary search.
    """

    reference_policies: ClassVar[dict[str, str]] = {
        "random": "uniform in [lo, hi], right format, ignores every hint",
        "random_distinct": "uniform over the numbers not guessed yet, ignores every hint",
        "random_in_hints": "uniform within the interval the hints leave open",
        "expert": "binary search",
    }

    def __init__(
        self,
        *,
        lo: int = 1,
        hi: int = 10,
        max_turns: int | None = None,
        feedback: Feedback = "hint",
        **kwargs: Any,
    ) -> None:
        if hi < lo:
            raise InvalidArgumentError(f"hi ({hi}) must be >= lo ({lo})")
        if feedback not in FEEDBACK_KINDS:
            allowed = ", ".join(FEEDBACK_KINDS)
            raise InvalidArgumentError(f"feedback must be one of {allowed}, got {feedback!r}")
        self.lo, self.hi = int(lo), int(hi)
        self.feedback: Feedback = feedback
        said = (
            "higher (the number is bigger) or lower (it is smaller)"
            if feedback == "hint"
            else "higher or lower and the range the number is still in, like lower (1-4)"
        )
        self.system_prompt = (
            f"I am thinking of an integer from {self.lo} to {self.hi}. Guess it. After each wrong guess "
            f"I say {said}. Reply with your guess like <answer>5</answer>."
        )
        worst_case = math.ceil(math.log2(self.hi - self.lo + 2))
        super().__init__(max_turns=worst_case + 1 if max_turns is None else max_turns, **kwargs)

    def new_game(self) -> str:
        self.target = int(self.np_random.integers(self.lo, self.hi + 1))
        self.low, self.high = self.lo, self.hi  # the interval the hints so far leave open
        self.guessed: set[int] = set()
        return self.render_state()

    def parse_move(self, text: str) -> int:
        if not _INTEGER.fullmatch(text):
            raise BadAnswer("Answer with one integer.")
        return int(text)

    def play(self, move: int) -> Result:
        self.guessed.add(move)
        if move == self.target:
            return Result("Correct!", success=True)
        if move < self.target:
            self.low = max(self.low, move + 1)
            return Result(self._reply("higher"))
        self.high = min(self.high, move - 1)
        return Result(self._reply("lower"))

    def _reply(self, hint: str) -> str:
        return hint if self.feedback == "hint" else f"{hint} ({self.low}-{self.high})"

    def render_state(self) -> str:
        if self.feedback == "hint":
            return f"Guess {self.lo} to {self.hi}."
        return f"Guess ({self.low}-{self.high})."

    def expert_move(self) -> str:
        return str((self.low + self.high) // 2)

    def random_move(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(self.lo, self.hi + 1)))

    def reference_move(self, name: str, rng: np.random.Generator) -> str:
        if name == "random_distinct":
            fresh = [n for n in range(self.lo, self.hi + 1) if n not in self.guessed]
            return str(int(rng.choice(fresh))) if fresh else self.random_move(rng)
        if name == "random_in_hints":
            return str(int(rng.integers(self.low, self.high + 1)))
        return super().reference_move(name, rng)


GUESS_NUMBER = EnvSpec(
    id="games/GuessNumber-v0",
    entry_point=GuessNumberEnv,
    kwargs={"lo": 1, "hi": 10},
    description="Guess an integer in 1-10 from higher/lower hints (5 turns).",
)
GUESS_NUMBER_INTERVAL = EnvSpec(
    id="games/GuessNumberInterval-v0",
    entry_point=GuessNumberEnv,
    kwargs={"lo": 1, "hi": 10, "feedback": "interval"},
    description="Guess an integer in 1-10; each reply states the range still open (5 turns).",
)
GUESS_NUMBER_100 = EnvSpec(
    id="games/GuessNumber100-v0",
    entry_point=GuessNumberEnv,
    kwargs={"lo": 1, "hi": 100},
    description="Guess an integer in 1-100 from higher/lower hints (8 turns).",
)
