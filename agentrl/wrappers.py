"""Adapters that turn other kinds of environments into agentrl text environments.

`GymnasiumAdapter` wraps a plain synchronous gymnasium env (any spaces). Its `reset`/`step` run
in a thread pool, so a slow or CPU-bound env never blocks the event loop that thousands of other
episodes share. Observations become text through a render function and action text becomes an
env action through a parse function; text that does not parse costs a format penalty and leaves
the env where it was, so a model learns the format instead of crashing the episode.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from agentrl.core import Env
from agentrl.errors import AgentRLError

ActionParser = Callable[[str], Any]
ObservationRenderer = Callable[[Any], str]


def default_action_parser(space: spaces.Space[Any]) -> ActionParser:
    """A parser for the common action spaces; raises `AgentRLError` for others (pass your own).

    Discrete takes one integer; Box, MultiDiscrete and MultiBinary take numbers separated by
    spaces or commas (brackets allowed, so `str(space.sample())` round-trips).
    """
    if isinstance(space, spaces.Discrete):
        return functools.partial(_parse_discrete, space)
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        return functools.partial(_parse_array, space)
    raise AgentRLError(
        f"No default action parser for {type(space).__name__}; pass parse_action= to GymnasiumAdapter"
    )


def _parse_discrete(space: spaces.Discrete, text: str) -> int:
    return int(text.strip())


def _parse_array(space: spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary, text: str) -> np.ndarray:
    numbers = text.replace(",", " ").replace("[", " ").replace("]", " ").split()
    return np.array([float(n) for n in numbers], dtype=space.dtype).reshape(space.shape)


def format_action(space: spaces.Space[Any], action: Any) -> str:
    """Write a space's action as text the default parser reads back."""
    if isinstance(action, np.ndarray):
        return " ".join(str(x) for x in action.ravel().tolist())
    return str(action)


class GymnasiumAdapter(Env):
    """Run a synchronous gymnasium env as an agentrl text env, off the event loop.

    Args:
        env: the gymnasium env (an instance, or its id for `gymnasium.make`).
        render_observation: observation -> text (default `str`).
        parse_action: action text -> env action (default: see `default_action_parser`). It may
            raise `ValueError`/`TypeError`; an action outside the action space counts the same.
        format_penalty: reward for an action that does not parse.
        system_prompt: instructions for the agent.
        executor: where the env's blocking calls run (default: the loop's default thread pool,
            which has min(32, CPUs + 4) threads; pass a bigger one for many slow envs).

    A step that times out in the manager is abandoned, not stopped: Python cannot kill a
    thread, so a truly hung `step` keeps its thread (and delays interpreter exit) until it
    returns. The manager closes and replaces such an env.
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any] | str,
        *,
        render_observation: ObservationRenderer = str,
        parse_action: ActionParser | None = None,
        format_penalty: float = -1.0,
        system_prompt: str = "",
        executor: Executor | None = None,
        **make_kwargs: Any,
    ) -> None:
        self.env = gymnasium.make(env, **make_kwargs) if isinstance(env, str) else env
        self.render_observation = render_observation
        self.parse_action = parse_action or default_action_parser(self.env.action_space)
        self.format_penalty = format_penalty
        self.system_prompt = system_prompt
        self.executor = executor
        self._observation: Any = None

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)
        observation, info = await self._in_thread(
            functools.partial(self.env.reset, seed=seed, options=options)
        )
        self._observation = observation
        return self.render_observation(observation), dict(info)

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            env_action = self.parse_action(action)
            valid = self.env.action_space.contains(env_action)
        except (ValueError, TypeError):
            valid = False
        if not valid:
            info = {"format_error": True}
            return self.render_observation(self._observation), self.format_penalty, False, False, info
        observation, reward, terminated, truncated, info = await self._in_thread(
            functools.partial(self.env.step, env_action)
        )
        self._observation = observation
        return self.render_observation(observation), float(reward), bool(terminated), bool(truncated), info

    async def aclose(self) -> None:
        await self._in_thread(self.env.close)

    def close(self) -> None:
        super().close()
        self.env.close()  # gymnasium envs tolerate a second close

    def sample_action(self) -> str:
        """A random valid action as text (used by `RandomPolicy`)."""
        space = self.env.action_space
        return format_action(space, space.sample())

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def __repr__(self) -> str:
        return f"GymnasiumAdapter({self.env!r})"
