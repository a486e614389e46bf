"""The web envs end to end against their real servers: experts solve every task, bad actions
cost a penalty and keep the page, the turn limit truncates, and gymnasium's checker passes."""

from __future__ import annotations

import gymnasium
import pytest
from agentrl_web.shop_env import ShopEnv
from agentrl_web.wiki_env import WikiEnv
from gymnasium.utils.env_checker import check_env

import agentrl

SEEDS = range(50)


async def test_shop_expert_solves_every_task(play_episode):
    env = ShopEnv()
    results = [await play_episode(env, seed) for seed in SEEDS]
    await env.aclose()
    assert all(r["success"] and r["reward"] == 1.0 and r["terminated"] for r in results), results


@pytest.mark.parametrize("task_kind", ["navigate", "question"])
async def test_wiki_expert_solves_every_task(play_episode, task_kind):
    env = WikiEnv(task_kind=task_kind)
    results = [await play_episode(env, seed) for seed in SEEDS]
    await env.aclose()
    assert all(r["success"] and r["reward"] == 1.0 and r["terminated"] for r in results), results
    assert all(
        r["task"].startswith("Answer" if task_kind == "question" else "Starting from") for r in results
    )


async def test_same_seed_gives_same_task_and_page():
    a, b = agentrl.make("web/Shop-v0"), agentrl.make("web/Shop-v0")
    obs_a, _ = await a.areset(seed=5)
    obs_b, _ = await b.areset(seed=5)
    assert obs_a == obs_b and a.session != b.session
    other, _ = await a.areset(seed=6)
    assert other != obs_a
    await a.aclose()
    await b.aclose()


@pytest.mark.parametrize("env_id", ["web/Shop-v0", "web/Wiki-v0"])
async def test_invalid_actions_cost_a_penalty_and_keep_the_page(env_id):
    env = agentrl.make(env_id, format_penalty=0.25)
    await env.areset(seed=0)
    page = env.page.url
    for action in [
        "",
        "dance",
        "click[999]",
        "type[1][x]" if env_id.endswith("Shop-v0") else "click[1000]",
        "back",
        "\x00" * 50,
        "<answer>",
        "search" * 1000,
    ]:
        _, reward, terminated, _, info = await env.astep(action)
        assert info["format_error"] and reward == -0.25 and not terminated, action
        assert env.page.url == page
    await env.aclose()


async def test_shop_answer_is_refused_and_wiki_navigation_answer_too():
    shop = ShopEnv()
    await shop.areset(seed=0)
    *_, info = await shop.astep("answer[done]")
    assert info["format_error"] and "no answer" in info["error"]
    wiki = WikiEnv(task_kind="navigate")
    await wiki.areset(seed=0)
    *_, info = await wiki.astep("answer[done]")
    assert info["format_error"] and "navigation task" in info["error"]
    await shop.aclose()
    await wiki.aclose()


async def test_wrong_answer_ends_the_episode_with_zero():
    env = WikiEnv(task_kind="question")
    await env.areset(seed=1)
    _, reward, terminated, _, info = await env.astep("<answer>answer[Atlantis]</answer>")
    assert terminated and reward == 0.0 and not info["success"]
    await env.aclose()


async def test_wrong_purchase_gets_partial_reward():
    """Buy the task's product in a wrong color: material, size and price match -> 0.75."""
    env = ShopEnv()
    await env.areset(seed=2)
    task = env.task
    product = env.catalogue.by_pid[task.source_pid]
    wrong = next(c for c in product.colors if c != task.color)
    await env.browser.goto(env.session_url(f"/product/{product.pid}"))
    for value in (wrong, task.size):
        button = next(e for e in env.page.elements if e.kind == "button" and e.text == value)
        await env.astep(f"click[{button.id}]")
    for label in ("Add to cart", "Checkout"):
        button = next(e for e in env.page.elements if e.kind == "button" and e.text == label)
        _, reward, terminated, _, info = await env.astep(f"click[{button.id}]")
    assert terminated and reward == 0.75 and not info["success"]
    await env.aclose()


async def test_turn_limit_truncates():
    env = ShopEnv(max_turns=3)
    await env.areset(seed=0)
    for _ in range(3):
        _, _, terminated, truncated, _ = await env.astep("back")
    assert truncated and not terminated
    await env.aclose()


async def test_random_actions_never_crash_an_episode(play_episode):
    for env in (ShopEnv(max_turns=30), WikiEnv(max_turns=30)):
        for seed in range(5):
            result = await play_episode(env, seed, lambda e: e.sample_action())
            assert result["terminated"] or result["truncated"]
        await env.aclose()


@pytest.mark.parametrize("env_id", ["web/Shop-v0", "web/Wiki-v0"])
def test_check_env_passes(env_id):
    env = agentrl.make(env_id)
    assert isinstance(env, gymnasium.Env)
    check_env(env, skip_render_check=True)
    env.close()
