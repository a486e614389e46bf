"""FrozenLake: walk from S to G on a random frozen lake without stepping into a hole.

Maps are drawn at random and redrawn until a path exists (checked by breadth-first search), so
every episode is solvable; the ice is not slippery, so the shortest path is an exact expert.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from agentrl import EnvSpec, InvalidArgumentError
from agentrl_games.base import Result, TextGame
from agentrl_games.grid import DIRECTIONS, Cell, parse_direction, shift

_MAX_DRAWS = 1000


class FrozenLakeEnv(TextGame[str]):
    """Move up/down/left/right from S (top-left) to G (bottom-right) avoiding holes H.

    The map is shown with `P` at the player's cell: `F` frozen (safe), `H` hole, `G` goal.
    Rewards: 1.0 on reaching G (terminates); falling into a hole terminates with reward
    `-step_cost` and `info["success"] = False`; `format_penalty` (-0.1) for an answer that is not
    a direction; `-step_cost` (0 by default) for other moves. Walking off the edge leaves the
    player in place (a wasted turn). `max_turns` defaults to size*size, always enough for the
    shortest path.

    Kwargs: `size` (side of the square map, >= 2), `hole_prob` (chance each cell other than S and G
    is a hole, < 1).
    """

    def __init__(
        self, *, size: int = 4, hole_prob: float = 0.2, max_turns: int | None = None, **kwargs: Any
    ) -> None:
        if size < 2:
            raise InvalidArgumentError(f"size must be >= 2, got {size}")
        if not 0.0 <= hole_prob < 1.0:
            raise InvalidArgumentError(f"hole_prob must be in [0, 1), got {hole_prob}")
        self.size, self.hole_prob = int(size), float(hole_prob)
        self.system_prompt = (
            f"You are P on a {self.size}x{self.size} frozen lake. Reach G without stepping on a hole H; "
            "F is safe ice, row 1 is the top. Each turn move one cell: "
            "<answer>up</answer>, <answer>down</answer>, <answer>left</answer> or <answer>right</answer>."
        )
        super().__init__(max_turns=self.size * self.size if max_turns is None else max_turns, **kwargs)

    def new_game(self) -> str:
        self.goal: Cell = (self.size - 1, self.size - 1)
        for _ in range(_MAX_DRAWS):
            holes = self.np_random.random((self.size, self.size)) < self.hole_prob
            holes[0, 0] = holes[self.goal] = False
            self.holes = holes
            self.player: Cell = (0, 0)
            if self._shortest_path() is not None:
                return self.render_state()
        # Dense lakes rarely have a path: clear the top row and right column as a last resort.
        self.holes[0, :] = False
        self.holes[:, -1] = False
        return self.render_state()

    def parse_move(self, text: str) -> str:
        return parse_direction(text)

    def play(self, move: str) -> Result:
        row, col = shift(self.player, move)
        if 0 <= row < self.size and 0 <= col < self.size:
            self.player = (row, col)
        if self.player == self.goal:
            return Result(self.render_state(), success=True)
        if self.holes[self.player]:
            return Result("You fell into a hole.", terminated=True)
        return Result(self.render_state())

    def render_state(self) -> str:
        rows = []
        for r in range(self.size):
            cells = []
            for c in range(self.size):
                if (r, c) == self.player:
                    cells.append("P")
                elif (r, c) == self.goal:
                    cells.append("G")
                elif (r, c) == (0, 0):
                    cells.append("S")
                else:
                    cells.append("H" if self.holes[r, c] else "F")
            rows.append("".join(cells))
        return "\n".join(rows)

    def expert_move(self) -> str:
        path = self._shortest_path()
        if not path:  # standing in a hole or on the goal: no move helps
            return "up"
        return path[0]

    def random_move(self, rng: np.random.Generator) -> str:
        return str(rng.choice(list(DIRECTIONS)))

    def _shortest_path(self) -> list[str] | None:
        """Directions of a shortest safe path from the player to the goal, or None."""
        parents: dict[Cell, tuple[Cell, str] | None] = {self.player: None}
        frontier = deque([self.player])
        while frontier:
            cell = frontier.popleft()
            if cell == self.goal:
                path = []
                while parents[cell] is not None:
                    cell, direction = parents[cell]  # type: ignore[misc]
                    path.append(direction)
                return path[::-1]
            for direction in DIRECTIONS:
                nxt = shift(cell, direction)
                if (
                    0 <= nxt[0] < self.size
                    and 0 <= nxt[1] < self.size
                    and nxt not in parents
                    and not self.holes[nxt]
                ):
                    parents[nxt] = (cell, direction)
                    frontier.append(nxt)
        return None


FROZEN_LAKE = EnvSpec(
    id="games/FrozenLake-v0",
    entry_point=FrozenLakeEnv,
    kwargs={"size": 4, "hole_prob": 0.2},
    description="Random solvable 4x4 frozen lake, walk from S to G avoiding holes (not slippery).",
)
FROZEN_LAKE_8X8 = EnvSpec(
    id="games/FrozenLake8x8-v0",
    entry_point=FrozenLakeEnv,
    kwargs={"size": 8, "hole_prob": 0.2},
    description="Random solvable 8x8 frozen lake (not slippery).",
)
