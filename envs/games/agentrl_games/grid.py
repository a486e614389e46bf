"""Grid moves shared by the grid games (FrozenLake, Sokoban): direction names and their parsing."""

from __future__ import annotations

from agentrl_games.base import BadAnswer

Cell = tuple[int, int]  # (row, column)

DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ALIASES = {
    "u": "up",
    "d": "down",
    "l": "left",
    "r": "right",
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
}


def parse_direction(text: str) -> str:
    """`up`/`down`/`left`/`right` (any case; single letters and compass names accepted)."""
    word = text.strip().lower().rstrip(".!")
    word = _ALIASES.get(word, word)
    if word not in DIRECTIONS:
        raise BadAnswer("Answer with one of: up, down, left, right.")
    return word


def shift(cell: Cell, direction: str) -> Cell:
    dr, dc = DIRECTIONS[direction]
    return cell[0] + dr, cell[1] + dc
