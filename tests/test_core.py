"""The Env contract: async-first methods, sync adapters, text spaces, gymnasium's checker."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from agentrl import AgentRLError, Env, TextSpace
from agentrl.wrappers import GymnasiumAdapter, default_action_parser, format_action


class Guess(Env):
    """Guess a number in 1..10 in `<answer>N</answer>` form; format errors are penalised."""

    system_prompt = "Guess my number between 1 and 10."

    def __init__(self) -> None:
        self.closed = False

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.target = int(self.np_random.integers(1, 11))
        return "Make a guess.", {}

    async def astep(self, action: str):
        text = action.strip()
        if not (text.startswith("<answer>") and text.endswith("</answer>")):
            return "Answer as <answer>N</answer>.", -0.1, False, False, {"format_error": True}
        guess = int(text[len("<answer>") : -len("</answer>")])
        if guess == self.target:
            return "Correct.", 1.0, True, False, {"success": True}
        return ("Higher." if guess < self.target else "Lower."), 0.0, False, False, {"success": False}

    async def aclose(self) -> None:
        self.closed = True


def test_sync_adapters_replay_the_async_episode():
    env = Guess()
    observation, _ = env.reset(seed=4)
    assert observation == "Make a guess."
    target = env.target
    assert env.step(f"<answer>{target}</answer>") == ("Correct.", 1.0, True, False, {"success": True})

    async def play_async() -> int:
        other = Guess()
        await other.areset(seed=4)
        return other.target

    assert asyncio.run(play_async()) == target  # same seed, same episode, sync or async
    env.close()
    assert env.closed


def test_unparseable_action_is_a_format_penalty_not_an_exception():
    env = Guess()
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("I think 5")
    assert (reward, terminated, truncated, info["format_error"]) == (-0.1, False, False, True)
    env.close()


async def test_sync_reset_inside_a_running_loop_says_to_await_areset():
    env = Guess()
    with pytest.raises(AgentRLError, match=r"await env.areset\(\)"):
        env.reset(seed=1)
    with pytest.raises(AgentRLError, match="running event loop"):
        env.step("<answer>1</answer>")


def test_text_space_admits_any_string_up_to_its_length():
    space = TextSpace(max_length=8)
    assert space.contains("héllo ✓")  # any characters, not only a charset
    assert space.contains("")
    assert not space.contains("x" * 9)
    assert not space.contains(5)
    assert repr(space) == "TextSpace(max_length=8)"


def test_gymnasium_check_env_passes_on_a_text_env():
    env = Guess()
    check_env(env, skip_render_check=True)
    env.close()


def test_gymnasium_check_env_passes_on_an_adapted_gymnasium_env():
    env = GymnasiumAdapter("FrozenLake-v1")
    check_env(env, skip_render_check=True)
    env.close()


def test_adapter_penalises_unparseable_and_out_of_space_actions_and_keeps_the_state():
    env = GymnasiumAdapter("FrozenLake-v1", is_slippery=False, format_penalty=-0.5)
    observation, _ = env.reset(seed=0)
    assert observation == "0"
    for bad in ("left", "7", "1.5"):
        assert env.step(bad) == ("0", -0.5, False, False, {"format_error": True})
    assert env.step("2")[0] == "1"  # moved right
    assert env.sample_action() in {"0", "1", "2", "3"}
    env.close()


def test_default_parsers_round_trip_sampled_actions():
    for space in (spaces.Discrete(5, start=1), spaces.Box(-1, 1, shape=(2, 3)), spaces.MultiDiscrete([3, 4])):
        space.seed(0)
        action = space.sample()
        parsed = default_action_parser(space)(format_action(space, action))
        assert space.contains(parsed)
        np.testing.assert_allclose(parsed, action, rtol=1e-6)
    with pytest.raises(AgentRLError, match="parse_action="):
        default_action_parser(spaces.Dict({"a": spaces.Discrete(2)}))
