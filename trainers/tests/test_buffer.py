"""StalenessBuffer: admission pauses producers on a condition, per-group staleness drops, filters."""

import asyncio
import itertools
import random

import pytest
from agentrl_trainers.buffer import StalenessBuffer

from agentrl.core import Env
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.protocol import PolicyInput, PolicyOutput
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn


def make_group(
    seed, rewards=(1.0, 0.0), version=0, length=2, *, scripted=False, reasons=None
) -> TrajectoryGroup:
    trajectories = []
    for i, reward in enumerate(rewards):
        turn = Turn("obs", "act", reward=reward)
        if not scripted:
            turn.prompt_token_ids = [1, 2]
            turn.action_token_ids = [3] * length
            turn.action_logprobs = [-1.0] * length
            turn.action_versions = [version] * length
        reason = reasons[i] if reasons else StopReason.TERMINATED
        trajectories.append(
            Trajectory(f"{seed}-{i}", "e", f"g{seed}", seed, turns=[turn], stop_reason=reason)
        )
    return TrajectoryGroup(f"g{seed}", seed, trajectories)


async def test_admission_blocks_on_a_condition_and_resumes_on_version_bump(monkeypatch):
    buffer = StalenessBuffer(batch_size=2, max_staleness=0)
    checks = 0
    original = buffer._admission_open

    def counting():
        nonlocal checks
        checks += 1
        return original()

    monkeypatch.setattr(buffer, "_admission_open", counting)
    seeds = buffer.admitted(itertools.count())
    assert [await anext(seeds), await anext(seeds)] == [0, 1]
    third = asyncio.create_task(anext(seeds))
    await asyncio.sleep(0.1)
    assert not third.done()  # (0 + 0 + 1) * 2 groups admitted: the producer waits
    checks_while_blocked = checks
    await asyncio.sleep(0.1)
    assert checks == checks_while_blocked  # no polling: the predicate is not re-evaluated while idle

    await buffer.put(make_group(0))
    await buffer.put(make_group(1))
    await asyncio.sleep(0.05)
    assert not third.done()  # finished groups still count until the trainer moves on
    batch = await buffer.get_batch(2, trainer_version=0)
    assert [g.seed for g in batch] == [0, 1]
    assert not third.done()
    await buffer.set_version(1)
    assert await asyncio.wait_for(third, 1) == 2
    assert buffer.metrics()["buffer/producer_wait_s"] >= 0.2


async def _rollouts(buffer, seeds, delays):
    """A producer standing in for the env manager: each group's tokens carry the admission version."""
    tasks = []
    async for seed in buffer.admitted(seeds):
        version = buffer.version

        async def finish(seed=seed, version=version):
            await asyncio.sleep(delays[seed % len(delays)])
            await buffer.put(make_group(seed, version=version))

        tasks.append(asyncio.create_task(finish()))
    await asyncio.gather(*tasks)


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_consumed_groups_never_exceed_max_staleness(max_staleness):
    buffer = StalenessBuffer(batch_size=3, max_staleness=max_staleness)
    producer = asyncio.create_task(_rollouts(buffer, range(60), delays=[0.001, 0.02, 0.005, 0.03]))
    for version in range(6):
        batch = await buffer.get_batch(3, trainer_version=version)
        assert len(batch) == 3
        assert all(version - g.oldest_version <= max_staleness for g in batch)
        await asyncio.sleep(0.01)  # "training"
        await buffer.set_version(version + 1)
    m = buffer.metrics()
    if max_staleness == 0:
        # synchronous: every group is on-policy and none is ever dropped
        assert m["buffer/staleness_0"] == 18
        assert m["buffer/dropped_stale"] == 0
    # Out-of-order completion can still leave a slow group behind the bound (the aggregate rule
    # does not prevent it); such groups are dropped and counted, never lost.
    held = m["buffer/ready"] + m["buffer/tail"] + m["buffer/running"]
    assert m["buffer/admitted"] == m["buffer/consumed"] + m["buffer/dropped_stale"] + held
    assert m["buffer/consumer_wait_s"] > 0
    await buffer.close()
    await asyncio.wait_for(producer, 2)


async def test_groups_over_the_bound_are_dropped_counted_and_replaced():
    buffer = StalenessBuffer(batch_size=1, max_staleness=1)
    seeds = buffer.admitted(itertools.count())
    assert [await anext(seeds), await anext(seeds)] == [0, 1]  # capacity (1 + 0 + 1) * 1
    await buffer.put(make_group(0, version=0))
    await buffer.put(make_group(1, version=2))  # e.g. tokens sampled after two pushes
    await buffer.set_version(2)
    assert buffer.metrics()["buffer/dropped_stale"] == 1  # group 0: staleness 2 > 1
    batch = await buffer.get_batch(1, trainer_version=2)
    assert [g.seed for g in batch] == [1]
    assert buffer.metrics()["buffer/staleness_0"] == 1
    # the dropped group freed its slot: capacity (1 + 2 + 1) = 4 > accepted 1 + running 0
    assert await asyncio.wait_for(anext(seeds), 1) == 2


async def test_scripted_groups_count_from_their_admission_version():
    buffer = StalenessBuffer(batch_size=1, max_staleness=1)
    seeds = buffer.admitted([7, 8])
    assert await anext(seeds) == 7  # admitted at version 0
    await buffer.set_version(1)
    assert await anext(seeds) == 8  # admitted at version 1
    await buffer.put(make_group(7, scripted=True))
    await buffer.put(make_group(8, scripted=True))
    await buffer.put(make_group(9, scripted=True))  # never admitted: counts from version 1 (now)
    await buffer.set_version(2)
    assert buffer.metrics()["buffer/dropped_stale"] == 1  # seed 7: 2 - 0 > 1
    batch = await buffer.get_batch(2, trainer_version=2)
    assert sorted(g.seed for g in batch) == [8, 9]


async def test_dynamic_filter_and_unfinished_trajectories():
    buffer = StalenessBuffer(batch_size=2, max_staleness=4, dynamic_filter=True)
    await buffer.put(make_group(0, rewards=(1.0, 1.0)))  # zero variance
    await buffer.put(make_group(1, rewards=(1.0, 0.0), reasons=[StopReason.ERROR, StopReason.TIMEOUT]))
    await buffer.put(
        make_group(
            2,
            rewards=(1.0, 0.0, 0.5),
            reasons=[StopReason.TERMINATED, StopReason.ERROR, StopReason.TRUNCATED],
        )
    )
    await buffer.put(make_group(3, rewards=(0.0, 1.0)))
    m = buffer.metrics()
    assert m["buffer/dropped_zero_variance"] == 1
    assert m["buffer/dropped_no_finished"] == 1
    assert m["buffer/unfinished_trajectories"] == 3
    batch = await buffer.get_batch(2, trainer_version=0)
    assert [g.seed for g in batch] == [2, 3]
    assert batch[0].rewards == [1.0, 0.5]  # the errored episode left its group


async def test_a_streak_of_zero_variance_groups_is_warned_about_once(caplog):
    buffer = StalenessBuffer(batch_size=2, max_staleness=4, dynamic_filter=True)
    with caplog.at_level("WARNING", logger="agentrl_trainers.buffer"):
        for seed in range(7):
            await buffer.put(make_group(seed, rewards=(0.0, 0.0)))
        assert not caplog.records  # 7 < 4 * batch_size
        for seed in range(7, 20):
            await buffer.put(make_group(seed, rewards=(0.0, 0.0)))
        assert len(caplog.records) == 1 and "last 8 groups in a row" in caplog.text
        await buffer.put(make_group(20, rewards=(0.0, 1.0)))  # the streak ends ...
        for seed in range(21, 29):
            await buffer.put(make_group(seed, rewards=(1.0, 1.0)))
    assert len(caplog.records) == 2  # ... and a new one is warned about again


async def test_a_group_missing_an_episode_is_dropped_whole_never_scored_as_zero():
    """An episode that ended in error or timeout is not a sample: its group is dropped and counted
    (a group with a spare finished episode from redundancy is kept, trimmed to group_size)."""
    buffer = StalenessBuffer(batch_size=2, max_staleness=4, group_size=2)
    errored = [StopReason.TERMINATED, StopReason.ERROR]
    await buffer.put(make_group(0, rewards=(1.0, 0.0), reasons=errored))
    spare = [StopReason.TERMINATED, StopReason.TRUNCATED, StopReason.TIMEOUT, StopReason.TERMINATED]
    await buffer.put(make_group(1, rewards=(1.0, 0.0, 0.0, 0.5), reasons=spare))
    await buffer.put(make_group(2, rewards=(0.0, 1.0)))
    m = buffer.metrics()
    assert m["buffer/dropped_incomplete"] == 1 and m["buffer/unfinished_trajectories"] == 2
    batch = await buffer.get_batch(2, trainer_version=0)
    assert [g.seed for g in batch] == [1, 2]
    assert batch[0].rewards == [1.0, 0.0]  # the first two finished episodes


async def test_a_filter_that_drops_everything_stops_training_with_a_reason():
    from agentrl_trainers.buffer import TrainingStalled

    buffer = StalenessBuffer(batch_size=2, max_staleness=8, dynamic_filter=True, max_filtered_groups=6)
    waiting = asyncio.create_task(buffer.get_batch(2, trainer_version=0))
    for seed in range(5):
        await buffer.put(make_group(seed, rewards=(0.0, 0.0)))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # 5 drops in a row: still waiting
    await buffer.put(make_group(5, rewards=(0.0, 0.0)))
    with pytest.raises(TrainingStalled, match="dynamic_filter dropped the last 6 groups"):
        await asyncio.wait_for(waiting, timeout=1)


async def test_without_dynamic_filter_equal_rewards_are_kept():
    buffer = StalenessBuffer(batch_size=1, max_staleness=0)
    await buffer.put(make_group(0, rewards=(1.0, 1.0)))
    assert [g.seed for g in await buffer.get_batch(1, 0)] == [0]


async def test_tail_batching_defers_long_groups_into_their_own_round():
    buffer = StalenessBuffer(batch_size=2, max_staleness=3, tail_batching=True, tail_quantile=0.75)
    for seed in range(4):  # history of short groups (2 * batch_size before anything counts as long)
        await buffer.put(make_group(seed, length=4))
    await buffer.put(make_group(10, length=40))  # long
    await buffer.put(make_group(4, length=3))
    await buffer.put(make_group(11, length=50))  # long
    assert [g.seed for g in await buffer.get_batch(2, 0)] == [10, 11]  # a whole tail batch: long round
    assert [g.seed for g in await buffer.get_batch(2, 0)] == [0, 1]
    assert buffer.metrics()["buffer/tail_rounds"] == 1


async def test_tail_groups_are_served_before_they_turn_stale():
    buffer = StalenessBuffer(batch_size=2, max_staleness=1, tail_batching=True, tail_quantile=0.75)
    for seed in range(4):
        await buffer.put(make_group(seed, length=4))
    await buffer.put(make_group(10, length=40, version=0))
    assert [g.seed for g in await buffer.get_batch(2, 0)] == [0, 1]  # the long one may wait a version
    assert [g.seed for g in await buffer.get_batch(2, 1)] == [10, 2]  # now or never: filled with short
    assert buffer.metrics()["buffer/dropped_stale"] == 0


async def test_close_returns_what_is_left():
    buffer = StalenessBuffer(batch_size=4, max_staleness=0)
    await buffer.put(make_group(0))
    waiter = asyncio.create_task(buffer.get_batch(4, 0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await buffer.close()
    assert [g.seed for g in await asyncio.wait_for(waiter, 1)] == [0]
    assert await buffer.get_batch(4, 0) == []


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessBuffer(batch_size=2, max_staleness=-1)
    with pytest.raises(ValueError, match="batch_size"):
        StalenessBuffer(batch_size=0, max_staleness=1)


async def test_a_batch_larger_than_admission_allows_is_refused():
    buffer = StalenessBuffer(batch_size=2, max_staleness=1)
    with pytest.raises(ValueError, match="num_groups=5"):
        await buffer.get_batch(5, 0)


class Coin(Env):
    """One step: 'heads' wins. Episodes of different seeds take different times, like real envs."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.delay = 0.002 * (seed % 7)
        return "call it", {}

    async def astep(self, action):
        await asyncio.sleep(self.delay)
        return "done", float(action == "heads"), True, False, {"success": action == "heads"}


class VersionedCoinPolicy:
    """Stands in for the policy server: stamps each sampled token with the current weight version."""

    def __init__(self) -> None:
        self.version = 0
        self.rng = random.Random(0)

    async def __call__(self, request: PolicyInput) -> PolicyOutput:
        await asyncio.sleep(0.001)
        heads = self.rng.random() < 0.5
        return PolicyOutput("heads" if heads else "tails", [7], [int(heads) + 1], [-0.69], [self.version])


@pytest.mark.parametrize("max_staleness", [0, 2])
async def test_buffer_feeds_and_paces_the_real_env_manager(max_staleness):
    batch_size, policy = 3, VersionedCoinPolicy()
    buffer = StalenessBuffer(batch_size, max_staleness, dynamic_filter=True)
    manager = EnvManager(Coin, policy, group_size=4, max_concurrency=64)

    async def produce():
        async for group in manager.stream(buffer.admitted(itertools.count())):
            await buffer.put(group)

    producer = asyncio.create_task(produce())
    for version in range(5):
        batch = await buffer.get_batch(batch_size, version)
        m = buffer.metrics()
        # Admission: never more than (max_staleness + version + 1) batches beyond what was dropped.
        dropped = m["buffer/dropped_stale"] + m["buffer/dropped_zero_variance"]
        assert m["buffer/admitted"] <= (max_staleness + version + 1) * batch_size + dropped
        for group in batch:
            assert 0 <= version - group.oldest_version <= max_staleness
            assert len(set(group.rewards)) > 1  # dynamic filter
            if max_staleness == 0:
                assert {v for t in group.trajectories for v in t.versions() if v >= 0} == {version}
        await asyncio.sleep(0.01)  # "train", then push the weights and tell the buffer
        policy.version = version + 1
        await buffer.set_version(version + 1)
    m = buffer.metrics()
    assert m["buffer/producer_wait_s"] > 0  # rollout was held back, not run ahead
    if max_staleness == 0:
        assert m["buffer/dropped_stale"] == 0 and m["buffer/staleness_0"] == 5 * batch_size
    await buffer.close()
    await asyncio.wait_for(producer, 5)
    await manager.aclose()
