"""Contract tests run on every env the suite registers: gymnasium checks, seeding, experts, bad input."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from importlib import metadata

import pytest
from agentrl_games import TextGame
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl.tools import parse_tool_calls

# Every id this distribution registers, read from its installed entry points, so a new entry
# point is covered without editing this file.
ENV_IDS = sorted(
    ep.name for ep in metadata.entry_points(group="agentrl.envs") if ep.value.startswith("agentrl_games.")
)
assert ENV_IDS, "agentrl-games is not installed: run `pip install -e envs/games --no-deps`"
EXPERT_SEEDS = range(20)

MALFORMED = [
    "",
    "   ",
    "left",
    "<answer>",
    "</answer>",
    "<answer></answer>",
    "<answer>   </answer>",
    "<answer>left",
    "answer>left</answer",
    "<answer>🙂🙂🙂 ünïcödé</answer>",
    "<answer>\x00\x01\x02</answer>",
    "<answer>" * 20_000,
    "x" * 60_000,
    "<answer>" + "9" * 5000 + "</answer>",
    "<answer>" + "(" * 3000 + "</answer>",
    "<answer>__import__('os').system('echo pwned')</answer>",
    "<answer>lambda: 1</answer>",
]


@pytest.fixture
def make_env() -> Iterator:
    """`agentrl.make`, closing every env it built (each owns a private event loop)."""
    made: list[agentrl.Env] = []

    def make(env_id: str, **kwargs) -> agentrl.Env:
        env = agentrl.make(env_id, **kwargs)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def expert_episode(env: agentrl.Env, seed: int) -> tuple[list[str], list[float], dict]:
    """Play the expert from `seed` to the end; return observations, rewards and the final info."""
    observation, _ = env.reset(seed=seed)
    observations, rewards = [observation], []
    while True:
        action = env.expert_action()
        calls = parse_tool_calls(action).calls if env.tools() else []
        if calls:  # a tool env's expert calls its tools, as the env manager would route them
            result = env.call_tool_sync(calls[0])
            observation, reward, terminated, truncated, info = (
                result.content,
                result.reward,
                result.terminated,
                result.truncated,
                result.info,
            )
        else:
            observation, reward, terminated, truncated, info = env.step(action)
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            return observations, rewards, info


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_env_checker_passes(env_id, make_env):
    env = make_env(env_id)
    with warnings.catch_warnings():
        # The only warning allowed: gymnasium cannot test render modes without its own spec.
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*alternative render modes.*")
        check_env(env)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_suite_envs_are_text_games_with_descriptions(env_id, make_env):
    spec = agentrl.spec(env_id)
    assert spec.id == env_id
    assert spec.description
    env = make_env(env_id)
    assert isinstance(env, TextGame)
    assert "<answer>" in env.system_prompt


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_expert_solves_every_seed_within_max_turns(env_id, make_env):
    env = make_env(env_id)
    for seed in EXPERT_SEEDS:
        _, rewards, info = expert_episode(env, seed)
        assert info["success"], f"{env_id} seed {seed}: expert failed after {len(rewards)} turns"
        assert rewards[-1] == 1.0
        assert len(rewards) <= env.max_turns


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_episode_and_different_seeds_differ(env_id, make_env):
    env, twin = make_env(env_id), make_env(env_id)
    # Whole expert episodes are compared: some games (Wordle, GuessNumber) hide the puzzle, so
    # their first observations are identical by design and only the feedback reveals the seed.
    episodes = [expert_episode(env, seed)[0] for seed in range(6)]
    assert [expert_episode(twin, seed)[0] for seed in range(6)] == episodes
    assert len({tuple(e) for e in episodes}) > 1


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_malformed_actions_get_format_penalty_and_keep_state(env_id, make_env):
    env = make_env(env_id, max_turns=len(MALFORMED) + 1)
    first, _ = env.reset(seed=3)
    for turn, action in enumerate(MALFORMED, start=1):
        observation, reward, terminated, truncated, info = env.step(action)
        assert info["format_error"] is True, repr(action[:50])
        assert reward == pytest.approx(-0.1)
        assert not terminated and not truncated
        assert info["turn"] == turn
        assert observation.endswith(first), "a format error must show the unchanged state"
        assert len(observation) < 500


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_max_turns_truncates_without_success(env_id, make_env):
    env = make_env(env_id, max_turns=2, format_penalty=-0.5)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("no answer here")
    assert (reward, terminated, truncated) == (-0.5, False, False)
    assert "success" not in info
    _, _, terminated, truncated, info = env.step("still nothing")
    assert truncated and not terminated
    assert info["success"] is False
    with pytest.raises(agentrl.AgentRLError, match="after the episode ended"):
        env.step(env.expert_action())


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_actions_are_well_formed(env_id, make_env):
    env = make_env(env_id, max_turns=50)
    env.reset(seed=1)
    for _ in range(20):
        *_, terminated, truncated, info = env.step(env.sample_action())
        assert info["format_error"] is False
        if terminated or truncated:
            env.reset()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_before_reset_raises_clear_error(env_id, make_env):
    with pytest.raises(agentrl.AgentRLError, match="before reset"):
        make_env(env_id).step("<answer>1</answer>")


async def test_async_interface_plays_an_episode():
    env = agentrl.make("games/GuessNumber-v0")
    await env.areset(seed=5)
    for _ in range(env.max_turns):
        *_, terminated, truncated, info = await env.astep(env.expert_action())
        if terminated or truncated:
            break
    assert info["success"] is True
    await env.aclose()
