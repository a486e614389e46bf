"""The shared turn loop of every game: answer parsing, format penalty, turn limit, success flag.

A game subclasses `TextGame` and writes only its rules:

- `new_game()` builds a fresh puzzle from `self.np_random` and returns the first observation;
- `parse_move(text)` turns the text inside the answer tags into a move, raising `BadAnswer`
  (with a short reason the agent will read) when it cannot;
- `play(move)` applies a legal move and returns a `Result`;
- `expert_move()` / `random_move()` return move texts for the scripted policies; both are also
  the reference policies "expert" and "random" (`reference_policies`), and a game adds its own
  by extending `reference_policies` and `reference_move`.

Parsing rule: the agent answers with `<answer>...</answer>`; tags are case-insensitive and may
contain spaces (`< ANSWER >`), the content is stripped. The LAST complete answer block wins,
because a model that reasons first may quote the format (or change its mind) before its final
answer. Text without a complete block is a format error.

Reward contract shared by all games (each game's docstring repeats its specifics):
- success: `success_reward` (1.0) on the step that solves the puzzle, which terminates;
- format error: `format_penalty` (-0.1), `info["format_error"] = True`, state unchanged, and the
  turn still counts towards `max_turns` (otherwise garbage could stall an episode forever);
- every other step: `-step_cost` (0.0 by default, set it to favour short solutions);
- `max_turns` reached without an end state: `truncated=True`, `info["success"] = False`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from agentrl import AgentRLError, Env, InvalidArgumentError

Move = TypeVar("Move")

_OPEN_TAG = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)


class BadAnswer(ValueError):
    """The answer block is missing or its content is not a move of this game."""


def extract_answer(text: str) -> str | None:
    """The stripped content of the last complete `<answer>...</answer>` block, or None.

    Linear in the length of `text` (no backtracking over huge or adversarial outputs).
    """
    if not isinstance(text, str):
        return None
    closes = list(_CLOSE_TAG.finditer(text))
    if not closes:
        return None
    close = closes[-1]
    opens = [m for m in _OPEN_TAG.finditer(text, 0, close.start())]
    if not opens:
        return None
    return text[opens[-1].end() : close.start()].strip()


def answer(move: str) -> str:
    """Wrap a move in the answer tags the parser expects."""
    return f"<answer>{move}</answer>"


@dataclass
class Result:
    """What one legal move did. `terminated` without `success` means the game is lost for good."""

    observation: str
    success: bool = False
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class TextGame(Env, Generic[Move]):
    """A single-player puzzle played in turns of `<answer>move</answer>`.

    Stepping before `reset()` or after the episode ended raises `AgentRLError`: both are caller
    bugs, and the environment manager records them as an `error` episode.
    """

    #: Turn limit used when the constructor is not given one.
    default_max_turns: int = 10

    reference_policies: ClassVar[dict[str, str]] = {
        "random": "a random move in the right format, ignoring every observation",
        "expert": "the scripted expert",
    }

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        format_penalty: float = -0.1,
        step_cost: float = 0.0,
        success_reward: float = 1.0,
    ) -> None:
        self.max_turns = self.default_max_turns if max_turns is None else int(max_turns)
        if self.max_turns < 1:
            raise InvalidArgumentError(f"max_turns must be >= 1, got {max_turns}")
        self.format_penalty = float(format_penalty)
        self.step_cost = float(step_cost)
        self.success_reward = float(success_reward)
        self.turn = 0
        self._state = "new"  # new -> playing -> over
        self._action_rng = np.random.default_rng(0)

    # -- the rules: subclasses implement these -------------------------------------------

    def new_game(self) -> str:
        """Generate a puzzle from `self.np_random`; return the first observation."""
        raise NotImplementedError

    def parse_move(self, text: str) -> Move:
        """The move written as `text` (already stripped); raise `BadAnswer` if it is not one."""
        raise NotImplementedError

    def play(self, move: Move) -> Result:
        """Apply `move` to the current state."""
        raise NotImplementedError

    def render_state(self) -> str:
        """The current state as shown to the agent (repeated after a format error)."""
        raise NotImplementedError

    def expert_move(self) -> str:
        """The scripted expert's move text for the current state (solves within `max_turns`)."""
        raise NotImplementedError

    def random_move(self, rng: np.random.Generator) -> str:
        """A plausible random move text, drawn from `rng`."""
        raise NotImplementedError

    # -- the turn loop ------------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)
        self.turn = 0
        observation = self.new_game()
        # A separate stream for sample_action(), drawn after generation so random play never
        # changes which puzzle a seed produces.
        self._action_rng = np.random.default_rng(int(self.np_random.integers(2**63)))
        self._state = "playing"
        return observation, {"max_turns": self.max_turns}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._state != "playing":
            raise AgentRLError(
                f"{type(self).__name__}.step() called "
                + ("before reset()" if self._state == "new" else "after the episode ended; call reset()")
            )
        self.turn += 1
        try:
            content = extract_answer(action)
            if content is None:
                raise BadAnswer("No <answer>...</answer> found.")
            move = self.parse_move(content)
        except BadAnswer as exc:
            observation = f"{exc}\n{self.render_state()}"
            return self._finish(observation, self.format_penalty, False, False, {"format_error": True})
        result = self.play(move)
        info = {"format_error": False, **result.info}
        reward = self.success_reward if result.success else -self.step_cost
        terminated = result.terminated or result.success
        return self._finish(result.observation, reward, terminated, result.success, info)

    def _finish(
        self, observation: str, reward: float, terminated: bool, success: bool, info: dict[str, Any]
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        truncated = not terminated and self.turn >= self.max_turns
        info["turn"] = self.turn
        if terminated or truncated:
            info["success"] = success
            self._state = "over"
        return observation, float(reward), terminated, truncated, info

    # -- scripted policies ----------------------------------------------------------------

    def expert_action(self) -> str:
        """The expert's move as a full action text, e.g. `<answer>left</answer>`."""
        return answer(self.expert_move())

    def sample_action(self) -> str:
        """A random plausible action text (the random policy's move)."""
        return answer(self.random_move(self._action_rng))

    def reference_move(self, name: str, rng: np.random.Generator) -> str:
        """The move text of reference policy `name`; a game with more references overrides this
        for its names and defers to `super()` for the rest."""
        if name == "random":
            return self.random_move(rng)
        if name == "expert":
            return self.expert_move()
        return Env.reference_action(self, name)  # raises UnknownReferencePolicy

    def reference_action(self, name: str) -> str:
        """Reference policy `name`'s action; its randomness comes from the episode's action stream."""
        if name not in self.reference_policies:
            return super().reference_action(name)
        return answer(self.reference_move(name, self._action_rng))
