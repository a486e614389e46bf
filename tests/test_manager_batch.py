"""EnvManager rollout="batch": the synchronous batch-level baseline (lockstep turns, batch by batch)."""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pytest

from agentrl import Env, PolicyInput, StopReason
from agentrl.errors import InvalidArgumentError
from agentrl.rollout.manager import EnvManager


class Paced(Env):
    """Episode length and step delay come from the seed: seed s plays 1 + s % 3 turns, each
    waiting 0.01 * (1 + s % 4) s. Every env step and policy call is logged with the loop time."""

    log: ClassVar[list[tuple[str, int, int, float]]] = []

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.seed, self.turn = seed, 0
        return "go", {}

    async def astep(self, action: str):
        Paced.log.append(("step", self.seed, self.turn, asyncio.get_running_loop().time()))
        await asyncio.sleep(0.01 * (1 + self.seed % 4))
        self.turn += 1
        done = self.turn >= 1 + self.seed % 3
        return "go", 1.0, done, False, {"success": done}


async def logging_policy(request: PolicyInput) -> str:
    Paced.log.append(("act", request.seed, request.turn, asyncio.get_running_loop().time()))
    await asyncio.sleep(0)
    return "a"


@pytest.fixture(autouse=True)
def _fresh_log():
    Paced.log = []


async def test_batch_mode_steps_every_live_env_of_the_batch_in_lockstep():
    manager = EnvManager(Paced, logging_policy, rollout="batch", batch_groups=6, max_concurrency=6)
    groups = await manager.run(range(6))
    assert len(groups) == 6 and manager.stats.finished == 6
    # Per turn: every policy call of the turn happens before any env step of the turn, and every
    # env step of turn t starts before any policy call of turn t + 1.
    for turn in range(3):
        acts = [t for kind, _, k, t in Paced.log if kind == "act" and k == turn]
        steps = [t for kind, _, k, t in Paced.log if kind == "step" and k == turn]
        later_acts = [t for kind, _, k, t in Paced.log if kind == "act" and k == turn + 1]
        live = sum(1 + s % 3 > turn for s in range(6))
        assert len(acts) == len(steps) == live
        assert max(acts) <= min(steps)
        if later_acts:
            # turn t + 1 begins only after the slowest env step of turn t has returned
            slowest = max(0.01 * (1 + s % 4) for s in range(6) if 1 + s % 3 > turn)
            assert min(later_acts) >= min(steps) + slowest - 1e-3


async def test_batch_mode_starts_the_next_batch_only_when_the_whole_batch_ended():
    manager = EnvManager(Paced, logging_policy, rollout="batch", batch_groups=3, max_concurrency=64)
    await manager.run(range(6))
    first_batch_end = max(t for kind, s, _, t in Paced.log if kind == "step" and s < 3)
    second_batch_start = min(t for kind, s, _, t in Paced.log if kind == "act" and s >= 3)
    assert second_batch_start > first_batch_end
    assert manager.stats.finished == 6 and manager.stats.in_flight == 0


async def test_rounds_mode_keeps_the_batches_but_not_the_lockstep():
    manager = EnvManager(Paced, logging_policy, rollout="rounds", batch_groups=3, max_concurrency=64)
    await manager.run([4, 7, 0, 1, 2, 3])

    # inside a round each episode runs on its own clock: seed 4 (0.01 s steps) takes its second
    # turn about 30 ms before seed 7 (0.04 s steps) does; in lockstep both wait for the slowest step
    def second_turn(seed: int) -> float:
        return min(t for kind, s, k, t in Paced.log if kind == "act" and s == seed and k == 1)

    assert second_turn(4) < second_turn(7) - 0.015
    # ...but the next round starts only when the whole round ended
    first_round_end = max(t for kind, s, _, t in Paced.log if kind == "step" and s in (4, 7, 0))
    assert min(t for kind, s, _, t in Paced.log if kind == "act" and s in (1, 2, 3)) > first_round_end
    assert manager.stats.finished == 6 and manager.stats.in_flight == 0


async def test_async_mode_lets_fast_episodes_run_ahead_of_slow_ones():
    manager = EnvManager(Paced, logging_policy, max_concurrency=64)
    await manager.run(range(6))
    # seed 4 (0.01 s steps, 2 turns) takes its second turn before seed 2 (0.03 s steps) takes its second
    seed4_turn1 = min(t for kind, s, k, t in Paced.log if kind == "act" and s == 4 and k == 1)
    seed2_turn1 = min(t for kind, s, k, t in Paced.log if kind == "act" and s == 2 and k == 1)
    assert seed4_turn1 < seed2_turn1


async def test_batch_mode_is_slower_than_async_by_the_barrier_waits():
    async def timed(rollout: str) -> float:
        manager = EnvManager(Paced, logging_policy, rollout=rollout, batch_groups=12, max_concurrency=12)
        started = time.perf_counter()
        await manager.run(range(48))
        return time.perf_counter() - started

    # batch: 4 batches x 3 turns x 0.04 s (the slowest env of each turn) = 0.48 s; async with 12
    # env slots: 48 episodes x 2 turns x 0.025 s on average / 12 slots, about 0.2-0.25 s.
    assert await timed("batch") > 1.3 * await timed("async")


async def test_redundant_episodes_cancelled_in_a_batch_do_not_hold_the_barrier():
    manager = EnvManager(
        Paced, logging_policy, rollout="batch", batch_groups=2, group_size=2, redundancy=1, max_concurrency=6
    )
    groups = await asyncio.wait_for(manager.run([0, 1, 2, 3]), timeout=5)
    assert len(groups) == 4
    assert all(len(g.trajectories) == 2 for g in groups)
    assert manager.stats.by_reason[StopReason.CANCELLED] + manager.stats.finished == 12


def test_batch_mode_settings_are_checked():
    with pytest.raises(InvalidArgumentError, match="rollout must be one of"):
        EnvManager(Paced, logging_policy, rollout="lockstep")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        EnvManager(Paced, logging_policy, rollout="batch", batch_groups=9, group_size=8, max_concurrency=64)
    with pytest.raises(InvalidArgumentError, match="batch_groups"):
        EnvManager(Paced, logging_policy, rollout="batch", batch_groups=0)


async def test_a_source_that_holds_tasks_back_gets_a_smaller_batch_not_a_deadlock():
    # Like a staleness buffer that admits replacements only once earlier groups came out: three
    # tasks at once, then two more only after the consumer has seen a group.
    released = asyncio.Event()

    async def source():
        for seed in (0, 1, 2):
            yield seed
        await released.wait()
        for seed in (3, 4):
            yield seed

    manager = EnvManager(Paced, logging_policy, rollout="batch", batch_groups=4, max_concurrency=8)
    seen = []
    async with asyncio.timeout(5):
        async for group in manager.stream(source()):
            seen.append(group.seed)
            released.set()
    assert sorted(seen) == [0, 1, 2, 3, 4]
    # the first batch was the three ready tasks; the later two ran as a batch of their own
    first_batch_end = max(t for kind, s, _, t in Paced.log if kind == "step" and s < 3)
    assert min(t for kind, s, _, t in Paced.log if kind == "act" and s >= 3) > first_batch_end


async def test_a_speculative_batch_ends_at_its_quota_and_defers_the_rest_whole():
    manager = EnvManager(
        Paced, logging_policy, rollout="batch", batch_groups=2, speculative_groups=1, max_concurrency=3
    )
    groups = await manager.run([0, 1, 2])  # seed s plays 1 + s % 3 turns: seed 2 is the long tail
    done = [g for g in groups if not g.deferred]
    deferred = [g for g in groups if g.deferred]
    assert sorted(g.seed for g in done) == [0, 1] and all(len(g.trajectories) == 1 for g in done)
    assert [(g.seed, g.trajectories, g.cancelled) for g in deferred] == [(2, [], 1)]
    stats = manager.stats
    assert (stats.groups_completed, stats.groups_deferred, stats.groups_launched) == (2, 1, 3)
    assert stats.launched == stats.ended == 3 and stats.by_reason[StopReason.CANCELLED] == 1
    # a batch of at most batch_groups tasks (a long round) plays to the end
    assert not any(g.deferred for g in await manager.run([2, 5]))


async def test_tail_batching_speculates_on_responses_in_short_rounds_only():
    """RollPacker's short round also launches extra responses per prompt and keeps the first
    `group_size`; its long round launches exactly `group_size` and waits for all of them."""

    async def slow_last_episode(request: PolicyInput) -> str:
        await asyncio.sleep(0.05 if request.index == 2 else 0)  # episode 2 of each group straggles
        return "a"

    manager = EnvManager(
        Paced,
        slow_last_episode,
        group_size=2,
        redundancy=1,
        rollout="batch",
        batch_groups=2,
        speculative_groups=1,
        max_concurrency=9,
    )
    short = await manager.run([0, 4, 2])  # seeds 0 and 4 play 1 turn, seed 2 plays 3
    done = sorted((g for g in short if not g.deferred), key=lambda g: g.seed)
    assert [g.seed for g in done] == [0, 4]
    assert all(len(g.trajectories) == 2 and g.cancelled == 1 for g in done)  # the straggler was cut
    assert manager.stats.launched == 9
    long = await manager.run([2, 5])  # a long round: no redundant episode launched
    assert manager.stats.launched == 9 + 4
    assert all(len(g.trajectories) == 2 and g.cancelled == 0 and not g.deferred for g in long)
    assert {t.episode_id[-2:] for g in long for t in g.trajectories} == {"e0", "e1"}


def test_speculative_groups_need_batch_rollout_and_room():
    with pytest.raises(InvalidArgumentError, match="speculative_groups"):
        EnvManager(Paced, logging_policy, speculative_groups=1)
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        EnvManager(
            Paced, logging_policy, rollout="batch", batch_groups=2, speculative_groups=1, max_concurrency=2
        )
