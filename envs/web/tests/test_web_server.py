"""One server per app shared by many episodes: 256 concurrent episodes all accounted for, crashes
mid-episode leave the server serving, sessions are bounded, and a standalone server works."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest
from agentrl_web.browser import http_client
from agentrl_web.server import WebServerError, shared_server
from agentrl_web.sessions import SessionStore
from agentrl_web.shop_env import ShopEnv
from agentrl_web.wiki_env import WikiEnv

from agentrl.rollout.manager import EnvManager
from agentrl.rollout.scripted import ExpertPolicy
from agentrl.trajectory import StopReason


@pytest.mark.parametrize("env_id", ["web/Shop-v0", "web/Wiki-v0"])
async def test_256_concurrent_episodes_share_one_server_and_all_finish(env_id):
    app = "shop" if env_id.endswith("Shop-v0") else "wiki"
    base_url = shared_server(app)
    manager = EnvManager(env_id, ExpertPolicy(), max_concurrency=256)
    groups = await manager.run(range(256))
    await manager.aclose()
    trajectories = [t for g in groups for t in g.trajectories]
    assert sorted(t.seed for t in trajectories) == list(range(256))  # every episode accounted for, once
    assert manager.stats.launched == manager.stats.ended == 256
    assert all(t.stop_reason == StopReason.TERMINATED and t.success for t in trajectories), [
        (t.seed, t.stop_reason, t.error) for t in trajectories if not t.success
    ]
    assert shared_server(app) == base_url  # still the one server
    info = (await http_client().get(f"{base_url}/api/info")).json()
    assert info["sessions"] <= 256  # the manager's idle envs still hold their last session, no more


class CrashingShopEnv(ShopEnv):
    """Raises in the middle of an episode, after its session started and a step was taken."""

    async def astep(self, action: str):
        if self.turn == 2:
            raise RuntimeError("env crashed")
        return await super().astep(action)


async def test_server_survives_envs_crashing_and_vanishing_mid_episode():
    manager = EnvManager(CrashingShopEnv, ExpertPolicy(), max_concurrency=16)
    groups = await manager.run(range(16))
    await manager.aclose()
    assert [t.stop_reason for g in groups for t in g.trajectories] == [StopReason.ERROR] * 16
    # episodes abandoned without aclose, one of them cancelled while its request is in flight
    abandoned = [ShopEnv() for _ in range(4)]
    for env in abandoned:
        await env.areset(seed=0)
    pending = asyncio.create_task(abandoned[0].astep("search[red shirt]"))
    await asyncio.sleep(0)
    pending.cancel()
    del abandoned
    env = ShopEnv()
    await env.areset(seed=3)
    done = False
    while not done:
        _, reward, terminated, truncated, _ = await env.astep(env.expert_action())
        done = terminated or truncated
    assert reward == 1.0
    await env.aclose()


async def test_aclose_deletes_the_session_on_the_server():
    base_url = shared_server("wiki")
    env = WikiEnv()
    await env.areset(seed=0)
    session = env.session
    assert (await http_client().get(f"{base_url}/api/sessions/{session}/trail")).status_code == 200
    await env.aclose()
    assert (await http_client().get(f"{base_url}/api/sessions/{session}/trail")).status_code == 404
    assert (await http_client().get(f"{base_url}/s/{session}/")).status_code == 404


def test_session_store_evicts_least_recently_used_and_expires_idle_sessions():
    store = SessionStore(dict, max_sessions=3, ttl=0.2)
    a, b, c = store.create(), store.create(), store.create()
    assert store.get(a) is not None  # a is now the most recently used
    d = store.create()
    assert len(store) == 3 and store.get(b) is None and store.get(a) is not None
    time.sleep(0.25)
    assert store.get(c) is None and store.get(d) is None
    store.create()
    assert len(store) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_standalone_server_is_usable_through_base_url_and_checks_the_seed():
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "agentrl_web.serve", "wiki", "--port", str(port)])
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base_url}/api/info").status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        env = WikiEnv(base_url=base_url, task_kind="question")
        await env.areset(seed=4)
        assert env.page.url.startswith(base_url)
        done = False
        while not done:
            _, reward, done, truncated, _ = await env.astep(env.expert_action())
            done = done or truncated
        assert reward == 1.0
        await env.aclose()
        with pytest.raises(WebServerError, match="seed=1"):
            await WikiEnv(base_url=base_url, world_seed=1).areset(seed=0)
        with pytest.raises(WebServerError, match="app='shop'"):
            await ShopEnv(base_url=base_url).areset(seed=0)
    finally:
        server.terminate()
        server.wait(10)
