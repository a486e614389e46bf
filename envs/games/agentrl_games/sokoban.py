"""Sokoban: push every box onto a target.

Levels are generated backwards: boxes start on their targets and the player walks at random,
sometimes *pulling* a box behind it. Every pull is the reverse of a legal push, so the level it
ends in can be solved by replaying the walk forwards. A breadth-first solver then measures the
optimal solution, which keeps levels within a difficulty band and is the scripted expert.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from agentrl import EnvSpec
from agentrl_games.base import Result, TextGame
from agentrl_games.grid import DIRECTIONS, Cell, parse_direction, shift

State = tuple[Cell, frozenset[Cell]]  # (player, boxes)

_MAX_ATTEMPTS = 200


class Level:
    """A Sokoban board: walls and targets are fixed; `solve` finds a shortest push plan."""

    def __init__(self, walls: np.ndarray, targets: frozenset[Cell]) -> None:
        self.walls = walls
        self.targets = targets
        self.dead = self._dead_cells()

    def free(self, cell: Cell) -> bool:
        row, col = cell
        return 0 <= row < self.walls.shape[0] and 0 <= col < self.walls.shape[1] and not self.walls[cell]

    def move(self, state: State, direction: str) -> State | None:
        """The state after the player walks or pushes in `direction`, or None if blocked."""
        player, boxes = state
        nxt = shift(player, direction)
        if not self.free(nxt):
            return None
        if nxt in boxes:
            beyond = shift(nxt, direction)
            if not self.free(beyond) or beyond in boxes:
                return None
            return nxt, (boxes - {nxt}) | {beyond}
        return nxt, boxes

    def solve(self, start: State, max_states: int = 200_000) -> list[str] | None:
        """A shortest list of moves that puts every box on a target, or None (unsolvable/too big)."""
        if start[1] == self.targets:
            return []
        parents: dict[State, tuple[State, str] | None] = {start: None}
        frontier = deque([start])
        while frontier and len(parents) < max_states:
            state = frontier.popleft()
            for direction in DIRECTIONS:
                nxt = self.move(state, direction)
                if nxt is None or nxt in parents or nxt[1] & self.dead:
                    continue
                parents[nxt] = (state, direction)
                if nxt[1] == self.targets:
                    return self._path(parents, nxt)
                frontier.append(nxt)
        return None

    @staticmethod
    def _path(parents: dict[State, tuple[State, str] | None], state: State) -> list[str]:
        moves = []
        while (link := parents[state]) is not None:
            state, direction = link
            moves.append(direction)
        return moves[::-1]

    def _dead_cells(self) -> frozenset[Cell]:
        """Free cells from which a box can never be pushed onto any target (pruned by `solve`).

        A box at b reaches b+d when b-d (where the player stands) and b+d are free; walking this
        relation backwards from the targets marks every cell that is still alive.
        """
        alive = set(self.targets)
        frontier = deque(self.targets)
        while frontier:
            cell = frontier.popleft()
            for direction in DIRECTIONS:
                dr, dc = DIRECTIONS[direction]
                box = (cell[0] - dr, cell[1] - dc)
                player = (box[0] - dr, box[1] - dc)
                if box not in alive and self.free(box) and self.free(player):
                    alive.add(box)
                    frontier.append(box)
        rows, cols = np.nonzero(~self.walls)
        return frozenset((int(r), int(c)) for r, c in zip(rows, cols, strict=True)) - alive


class SokobanEnv(TextGame[str]):
    """Push the boxes ($) onto the targets (.) by walking into them; boxes cannot be pulled.

    Board symbols: `#` wall, `_` floor, `.` target, `$` box, `*` box on target, `@` player,
    `+` player on target. Rewards: 1.0 when every box is on a target (terminates);
    `format_penalty` (-0.1) for an answer that is not a direction; `-step_cost` (0 by default)
    for other moves, including blocked ones (wall, or a box that cannot move), which change
    nothing. A box pushed into a dead corner is not detected: the episode runs to `max_turns`.

    Kwargs: `width`, `height` (board size including the outer wall, >= 4), `num_boxes`,
    `wall_prob` (chance of an inner wall per cell), `min_solution`/`max_solution` (the band of
    optimal solution lengths the generator aims for; levels are always solvable, and if no level
    in the band turns up after some attempts, the closest one found is used). `max_turns`
    defaults to twice `max_solution` (at least 20).
    """

    def __init__(
        self,
        *,
        width: int = 6,
        height: int = 6,
        num_boxes: int = 1,
        wall_prob: float = 0.0,
        min_solution: int = 3,
        max_solution: int = 12,
        max_turns: int | None = None,
        **kwargs: Any,
    ) -> None:
        if width < 4 or height < 4:
            raise ValueError(f"width and height must be >= 4, got {width}x{height}")
        if not 1 <= num_boxes <= (width - 2) * (height - 2) - 2:
            raise ValueError(f"num_boxes must be between 1 and the interior area minus 2, got {num_boxes}")
        if not 0.0 <= wall_prob < 1.0:
            raise ValueError(f"wall_prob must be in [0, 1), got {wall_prob}")
        if not 1 <= min_solution <= max_solution:
            raise ValueError(f"need 1 <= min_solution <= max_solution, got {min_solution}, {max_solution}")
        self.width, self.height, self.num_boxes = int(width), int(height), int(num_boxes)
        self.wall_prob = float(wall_prob)
        self.min_solution, self.max_solution = int(min_solution), int(max_solution)
        boxes = "the box" if num_boxes == 1 else f"all {num_boxes} boxes"
        self.system_prompt = (
            f"Sokoban. Push {boxes} onto the targets. Map: # wall, _ floor, . target, $ box, "
            "* box on target, @ you, + you on target. Walk into a box to push it; you cannot pull. "
            "Each turn move one cell: <answer>up</answer>, <answer>down</answer>, "
            "<answer>left</answer> or <answer>right</answer>."
        )
        default_turns = max(20, 2 * self.max_solution)
        super().__init__(max_turns=default_turns if max_turns is None else max_turns, **kwargs)

    # -- generation ---------------------------------------------------------------------

    def new_game(self) -> str:
        best: tuple[int, Level, State, list[str]] | None = None
        for _ in range(_MAX_ATTEMPTS):
            drawn = self._draw_level()
            if drawn is None:
                continue
            level, state = drawn
            plan = level.solve(state)
            if plan is None:
                continue
            miss = max(self.min_solution - len(plan), len(plan) - self.max_solution, 0)
            if best is None or miss < best[0]:
                best = (miss, level, state, plan)
            if miss == 0:
                break
        if best is None:
            raise RuntimeError(f"could not generate a solvable {self.width}x{self.height} Sokoban level")
        _, self.level, self.state, plan = best
        self._expert: dict[State, str] = {}
        self._remember(plan)
        return self.render_state()

    def _draw_level(self) -> tuple[Level, State] | None:
        rng = self.np_random
        walls = np.ones((self.height, self.width), dtype=bool)
        walls[1:-1, 1:-1] = rng.random((self.height - 2, self.width - 2)) < self.wall_prob
        floor = _largest_region(walls)
        if len(floor) < self.num_boxes + 2:
            return None
        walls[:] = True
        for cell in floor:
            walls[cell] = False
        picks = rng.choice(len(floor), size=self.num_boxes + 1, replace=False)
        targets = frozenset(floor[i] for i in picks[:-1])
        level = Level(walls, targets)
        player, boxes = floor[picks[-1]], set(targets)
        for _ in range(8 * len(floor)):
            direction = list(DIRECTIONS)[int(rng.integers(4))]
            nxt = shift(player, direction)
            if not level.free(nxt) or nxt in boxes:
                continue
            behind = shift(player, _OPPOSITE[direction])
            if behind in boxes and rng.random() < 0.7:  # pull the box along
                boxes.remove(behind)
                boxes.add(player)
            player = nxt
        if boxes == targets:
            return None
        return level, (player, frozenset(boxes))

    # -- play ---------------------------------------------------------------------------

    def parse_move(self, text: str) -> str:
        return parse_direction(text)

    def play(self, move: str) -> Result:
        nxt = self.level.move(self.state, move)
        if nxt is not None:
            self.state = nxt
        return Result(self.render_state(), success=self.state[1] == self.level.targets)

    def render_state(self) -> str:
        player, boxes = self.state
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = (r, c)
                on_target = cell in self.level.targets
                if self.level.walls[cell]:
                    row.append("#")
                elif cell == player:
                    row.append("+" if on_target else "@")
                elif cell in boxes:
                    row.append("*" if on_target else "$")
                else:
                    row.append("." if on_target else "_")
            rows.append("".join(row))
        return "\n".join(rows)

    # -- scripted policies ----------------------------------------------------------------

    def expert_move(self) -> str:
        if self.state not in self._expert:
            plan = self.level.solve(self.state)
            if not plan:  # solved already, or a box is stuck: no move helps
                return "up"
            self._remember(plan)
        return self._expert[self.state]

    def random_move(self, rng: np.random.Generator) -> str:
        return str(rng.choice(list(DIRECTIONS)))

    def _remember(self, plan: list[str]) -> None:
        """Record the expert's move for every state along `plan` (one BFS serves the episode)."""
        state = self.state
        for direction in plan:
            self._expert[state] = direction
            state = self.level.move(state, direction)  # type: ignore[assignment]


_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}


def _largest_region(walls: np.ndarray) -> list[Cell]:
    """The cells of the largest 4-connected region of non-wall cells, in row-major order."""
    seen: set[Cell] = set()
    best: list[Cell] = []
    for r, c in zip(*np.nonzero(~walls), strict=True):
        start = (int(r), int(c))
        if start in seen:
            continue
        region, frontier = [start], deque([start])
        seen.add(start)
        while frontier:
            cell = frontier.popleft()
            for direction in DIRECTIONS:
                nxt = shift(cell, direction)
                if not walls[nxt] and nxt not in seen:
                    seen.add(nxt)
                    region.append(nxt)
                    frontier.append(nxt)
        if len(region) > len(best):
            best = region
    return sorted(best)


SOKOBAN = EnvSpec(
    id="games/Sokoban-v0",
    entry_point=SokobanEnv,
    kwargs={"width": 6, "height": 6, "num_boxes": 1},
    description="Procedurally generated solvable 6x6 Sokoban with 1 box.",
)
SOKOBAN_8X8 = EnvSpec(
    id="games/Sokoban8x8-v0",
    entry_point=SokobanEnv,
    kwargs={"width": 8, "height": 8, "num_boxes": 2, "wall_prob": 0.1, "min_solution": 6, "max_solution": 30},
    description="Procedurally generated solvable 8x8 Sokoban with 2 boxes and inner walls.",
)
