"""Sokoban and FrozenLake: generated boards are solvable and the move rules hold."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from agentrl_games.grid import DIRECTIONS, shift
from agentrl_games.sokoban import Level, SokobanEnv

import agentrl


def replay(level: Level, state, plan: list[str]):
    for direction in plan:
        state = level.move(state, direction)
        assert state is not None, "the plan walks into a wall or an immovable box"
    return state


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"width": 8, "height": 8, "num_boxes": 2, "wall_prob": 0.1, "min_solution": 6, "max_solution": 30},
        {"width": 7, "height": 5, "num_boxes": 2},
    ],
)
def test_sokoban_levels_are_solvable_by_bfs(kwargs):
    env = SokobanEnv(**kwargs)
    for seed in range(15):
        env.reset(seed=seed)
        level, state = env.level, env.state
        assert len(state[1]) == len(level.targets) == env.num_boxes
        assert state[1] != level.targets, "a level must not start solved"
        assert level.walls[0].all() and level.walls[-1].all() and level.walls[:, 0].all()
        plan = level.solve(state)
        assert plan is not None
        assert replay(level, state, plan)[1] == level.targets
    env.close()


def test_sokoban_dead_cell_pruning_keeps_optimal_length():
    """The solver prunes boxes on dead cells; a plain BFS without pruning must agree on length."""
    env = SokobanEnv(width=7, height=7, num_boxes=2, wall_prob=0.15)
    for seed in range(8):
        env.reset(seed=seed)
        level, start = env.level, env.state
        seen, frontier, plain = {start}, deque([(start, 0)]), None
        while frontier:
            state, depth = frontier.popleft()
            if state[1] == level.targets:
                plain = depth
                break
            for direction in DIRECTIONS:
                nxt = level.move(state, direction)
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    frontier.append((nxt, depth + 1))
        assert plain == len(level.solve(start))
    env.close()


def test_sokoban_push_rules():
    walls = np.ones((5, 6), dtype=bool)
    walls[1:-1, 1:-1] = False  # a 3x4 room
    level = Level(walls, frozenset({(2, 4)}))
    state = ((2, 1), frozenset({(2, 2)}))
    state = level.move(state, "right")  # push the box one cell
    assert state == ((2, 2), frozenset({(2, 3)}))
    state = level.move(state, "right")
    assert state[1] == level.targets
    assert level.move(state, "right") is None  # box against the wall cannot move
    assert level.move(((1, 1), frozenset({(2, 2)})), "up") is None  # wall
    two_boxes = ((2, 1), frozenset({(2, 2), (2, 3)}))
    assert level.move(two_boxes, "right") is None  # cannot push two boxes


def test_sokoban_render_and_blocked_moves_keep_state():
    env = agentrl.make("games/Sokoban-v0")
    observation, _ = env.reset(seed=2)
    rows = observation.splitlines()
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    assert observation.count("@") + observation.count("+") == 1
    assert observation.count("$") + observation.count("*") == 1
    assert set(observation) <= set("#_.$*@+\n")
    blocked = next(d for d in DIRECTIONS if env.level.move(env.state, d) is None)  # the player is boxed in
    state = env.state
    assert env.step(f"<answer>{blocked}</answer>")[0] == observation
    assert env.state == state
    env.close()


def shortest_path_exists(holes: np.ndarray) -> bool:
    size = holes.shape[0]
    seen, frontier = {(0, 0)}, deque([(0, 0)])
    while frontier:
        cell = frontier.popleft()
        if cell == (size - 1, size - 1):
            return True
        for direction in DIRECTIONS:
            r, c = shift(cell, direction)
            if 0 <= r < size and 0 <= c < size and not holes[r, c] and (r, c) not in seen:
                seen.add((r, c))
                frontier.append((r, c))
    return False


@pytest.mark.parametrize(("size", "hole_prob"), [(4, 0.2), (8, 0.2), (6, 0.6), (3, 0.95)])
def test_frozen_lake_maps_always_have_a_path(size, hole_prob):
    env = agentrl.make("games/FrozenLake-v0", size=size, hole_prob=hole_prob)
    for seed in range(20):
        observation, _ = env.reset(seed=seed)
        assert len(observation.splitlines()) == size
        assert shortest_path_exists(env.holes)
    env.close()


def test_frozen_lake_hole_ends_the_episode_and_edges_block():
    env = agentrl.make("games/FrozenLake-v0")
    env.reset(seed=0)
    env.holes[:] = False
    env.holes[1, 0] = True
    observation, reward, terminated, _, info = env.step("<answer>up</answer>")  # off the edge: stay
    assert env.player == (0, 0) and not terminated and observation.startswith("P")
    _, reward, terminated, _, info = env.step("<answer>D</answer>")  # aliases are accepted
    assert terminated and info["success"] is False and reward == 0.0
    env.close()
