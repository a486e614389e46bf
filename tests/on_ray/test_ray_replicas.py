"""Policy replicas behind the router on a real Ray cluster: routing, weight versions, faults."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

from agentrl.generation import SamplingParams  # noqa: E402
from agentrl.ray.env_worker import ManagerSpec, PolicySpec  # noqa: E402
from agentrl.ray.replicas import ReplicaPool, Router  # noqa: E402
from agentrl.ray.rollout import RayRollout  # noqa: E402
from agentrl.serving.model import CausalLM  # noqa: E402
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup  # noqa: E402


async def test_router_keeps_each_session_on_its_replica_and_balances_new_ones(ray_cluster) -> None:
    router = ray.remote(Router).options(num_cpus=0).remote()
    try:
        for replica_id in (0, 1):  # placeholder handles: this tests the routing table only
            await router.add.remote(replica_id, 1, f"replica-{replica_id}", 0)
        first = [(await router.route.remote(f"s{i}"))[0] for i in range(4)]
        assert sorted(first) == [0, 0, 1, 1], "new sessions go to the least loaded replica"
        again = [(await router.route.remote(f"s{i}"))[0] for i in range(4)]
        assert again == first, "every turn of a session goes to the replica holding its prefix"
        await router.report_dead.remote(0, 1)
        moved = [(await router.route.remote(f"s{i}"))[0] for i in range(4)]
        assert moved == [1, 1, 1, 1], "a dead replica's sessions move to a live one"
        await router.add.remote(0, 2, "replica-0-restarted", 3)
        assert (await router.route.remote("new", 3))[:2] == (0, 2), (
            "only replicas at >= the episode's version"
        )
        await router.report_dead.remote(0, 1)  # a late report about the old incarnation: ignored
        assert 0 in (await router.snapshot.remote())["live"]
    finally:
        ray.kill(router)


def _expected_prompts(trajectory: Trajectory, tokenizer) -> list[list[int]]:
    """The prompt tokens each turn must carry: the first turn's whole chat, then only what is new."""
    messages = [{"role": "system", "content": trajectory.system_prompt}] if trajectory.system_prompt else []
    messages.append({"role": "user", "content": trajectory.turns[0].observation})
    prompts = [tokenizer.encode_chat(messages, add_generation_prompt=True)]
    for previous, turn in zip(trajectory.turns, trajectory.turns[1:], strict=False):
        closed = bool(previous.action_token_ids) and previous.action_token_ids[-1] == tokenizer.end_of_turn_id
        new = [{"role": "user", "content": turn.observation}]
        prompts.append(tokenizer.encode(tokenizer.continuation_text(new, closed=closed)))
    return prompts


async def test_killing_a_replica_and_an_env_worker_mid_run_loses_nothing_and_keeps_versions_monotone(
    ray_cluster, ckpt, tokenizer
) -> None:
    state = CausalLM.from_pretrained(ckpt).state_dict()
    seeds = range(10)
    delivered: list[TrajectoryGroup] = []
    version = 0
    async with ReplicaPool(ckpt, replicas=2, cpus_per_replica=0.5) as pool:
        assert len(set(pool.nodes.values())) == 2, "the placement group spreads replicas over nodes"
        policy = PolicySpec(
            "router", target=pool.router, tokenizer=str(ckpt), sampling=SamplingParams(max_tokens=4)
        )
        spec = ManagerSpec("games/GuessNumber-v0", group_size=2, max_concurrency=12, max_turns=3)
        async with RayRollout(spec, policy, workers=2, cpus_per_worker=0.5) as rollout:
            async for group in rollout.stream(seeds):
                delivered.append(group)
                if len(delivered) % 3 == 0:
                    version += 1
                    await pool.push(state, version)
                if len(delivered) == 2:
                    ray.kill(pool.actor(0))
                if len(delivered) == 4:
                    ray.kill(rollout.actor(1))
        for _ in range(120):  # the rollout may finish on one replica before the other is back
            if pool.restarts:
                break
            await asyncio.sleep(0.5)
        snapshot = await pool.snapshot()

    stats = rollout.stats
    assert sorted(g.seed for g in delivered) == list(seeds), "every group delivered exactly once"
    assert stats.launched == stats.ended and stats.by_reason[StopReason.ABORTED] > 0, stats.as_dict()
    assert pool.restarts >= 1 and snapshot["live"] == [0, 1]
    assert snapshot["versions"] == {0: version, 1: version}
    trajectories = [t for g in delivered for t in g.trajectories]
    assert {t.stop_reason for t in trajectories} <= {StopReason.TERMINATED, StopReason.TRUNCATED}
    for t in trajectories:
        for turn in t.turns:
            assert 1 <= len(turn.action_token_ids) <= 4 and turn.finish_reason in ("stop", "length")
            assert len(turn.action_logprobs) == len(turn.action_versions) == len(turn.action_token_ids)
        sampled = [v for turn in t.turns for v in turn.action_versions]
        assert sampled == sorted(sampled) and set(sampled) <= set(range(version + 1)), sampled
        assert [turn.prompt_token_ids for turn in t.turns] == _expected_prompts(t, tokenizer)
    assert max(v for t in trajectories for turn in t.turns for v in turn.action_versions) > 0
    print(f"resampled turns: {rollout.resampled_turns}, router: {snapshot}")


async def test_a_policy_turn_past_its_timeout_ends_the_episode_as_timeout_on_the_worker(
    ray_cluster, ckpt
) -> None:
    async with ReplicaPool(ckpt, replicas=1, cpus_per_replica=0.5) as pool:
        policy = PolicySpec(
            "router",
            target=pool.router,
            tokenizer=str(ckpt),
            sampling=SamplingParams(max_tokens=4),
            turn_timeout=1e-3,
        )
        spec = ManagerSpec("games/GuessNumber-v0", max_concurrency=4, max_turns=3)
        async with RayRollout(spec, policy, workers=1, cpus_per_worker=0.5) as rollout:
            trajectories = [t for g in await rollout.run(range(4)) for t in g.trajectories]
    assert {t.stop_reason for t in trajectories} == {StopReason.TIMEOUT}
    assert all(
        "turn exceeded turn_timeout=0.001s on policy replica 0" in (t.error or "") for t in trajectories
    )
    assert rollout.stats.by_reason[StopReason.TIMEOUT] == rollout.stats.launched == 4
