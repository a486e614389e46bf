"""EnvManager: concurrency, accounting, fault isolation, groups, back-pressure, shutdown."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

import gymnasium
import pytest
from gymnasium import spaces

from agentrl import Env, PolicyInput, PolicyOutput, StopReason, Trajectory, UnknownEnvError
from agentrl.rollout.manager import EnvManager, Task
from agentrl.rollout.scripted import RandomPolicy
from agentrl.wrappers import GymnasiumAdapter


class Countdown(Env):
    """Ends after `length` steps; each step yields to the loop like an env doing I/O.

    Seeds pick a behaviour so one env class can model healthy and faulty envs: seeds with
    `seed % 20 == 0` raise on their second step, `seed % 20 == 10` hang forever.
    """

    system_prompt = "Count down."
    live = 0  # episodes between reset and their last step, across all instances
    peak = 0
    created = 0
    closed = 0

    def __init__(self, length: int = 3, faulty: bool = False, step_delay: float = 0.0) -> None:
        self.length = length
        self.faulty = faulty
        self.step_delay = step_delay
        type(self).created += 1

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.seed, self.left = seed, self.length
        cls = type(self)
        cls.live += 1
        cls.peak = max(cls.peak, cls.live)
        return f"{self.left} left", {"seed": seed}

    async def astep(self, action: str):
        await asyncio.sleep(self.step_delay)
        if self.faulty and self.left == self.length - 1:
            if self.seed % 20 == 0:
                raise RuntimeError(f"env for seed {self.seed} broke")
            if self.seed % 20 == 10:
                await asyncio.Event().wait()
        self.left -= 1
        done = self.left == 0
        if done:
            type(self).live -= 1
        return f"{self.left} left", 1.0, done, False, {"success": done}

    async def aclose(self) -> None:
        type(self).closed += 1


@pytest.fixture(autouse=True)
def reset_counters():
    Countdown.live = Countdown.peak = Countdown.created = Countdown.closed = 0


async def instant_policy(request: PolicyInput) -> str:
    return "tick"


def assert_all_accounted(manager: EnvManager) -> None:
    stats = manager.stats
    assert stats.in_flight == 0
    assert stats.launched == stats.ended


def assert_no_leaked_tasks() -> None:
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_4096_envs_run_concurrently_to_completion_with_every_episode_accounted():
    manager = EnvManager(Countdown, instant_policy, max_concurrency=4096)
    groups = await manager.run(range(4096))
    assert Countdown.peak == 4096  # all were mid-episode at the same time: no turn barrier
    assert sorted(g.seed for g in groups) == list(range(4096))
    assert all(
        len(g.trajectories) == 1 and g.trajectories[0].stop_reason is StopReason.TERMINATED for g in groups
    )
    assert manager.stats.by_reason[StopReason.TERMINATED] == 4096
    assert manager.stats.env_steps == 3 * 4096
    assert_all_accounted(manager)
    await manager.aclose()
    assert Countdown.closed == Countdown.created
    assert_no_leaked_tasks()


async def test_the_policy_is_told_each_episodes_task_seed_and_index_in_its_group():
    seen: set[tuple[int | None, int, int]] = set()

    async def recording_policy(request: PolicyInput) -> str:
        seen.add((request.seed, request.index, request.turn))
        return "tick"

    manager = EnvManager(Countdown, recording_policy, group_size=3)
    await manager.run([5, 6])
    await manager.aclose()
    assert seen == {(seed, index, turn) for seed in (5, 6) for index in range(3) for turn in range(3)}


async def test_a_tenth_of_envs_raising_or_hanging_are_marked_and_the_rest_complete():
    manager = EnvManager(
        lambda: Countdown(faulty=True), instant_policy, max_concurrency=1000, step_timeout=0.3
    )
    groups = await manager.run(range(1000))
    by_seed = {g.seed: g.trajectories[0] for g in groups}
    assert len(by_seed) == 1000
    for seed, trajectory in by_seed.items():
        if seed % 20 == 0:
            assert trajectory.stop_reason is StopReason.ERROR
            assert trajectory.error == f"RuntimeError: env for seed {seed} broke"
            assert len(trajectory.turns) == 1  # the turn before the failure is kept
        elif seed % 20 == 10:
            assert trajectory.stop_reason is StopReason.TIMEOUT
            assert "step_timeout=0.3" in trajectory.error
        else:
            assert trajectory.stop_reason is StopReason.TERMINATED
            assert trajectory.success
    counts = manager.stats.by_reason
    assert (counts[StopReason.ERROR], counts[StopReason.TIMEOUT], counts[StopReason.TERMINATED]) == (
        50,
        50,
        900,
    )
    assert_all_accounted(manager)
    await manager.aclose()
    assert Countdown.closed == Countdown.created  # broken envs were closed, not leaked
    assert_no_leaked_tasks()


async def test_broken_envs_are_replaced_and_healthy_ones_reused():
    manager = EnvManager(lambda: Countdown(faulty=True), instant_policy, max_concurrency=1)
    await manager.run([0, 1, 2, 20, 3])  # seeds 0 and 20 break their env
    assert Countdown.created == 3  # the first env, a replacement after seed 0, one after seed 20
    assert Countdown.closed == 2
    await manager.aclose()
    assert Countdown.closed == 3


async def test_episode_timeout_counts_policy_time_too():
    async def slow_policy(request: PolicyInput) -> str:
        await asyncio.sleep(0.05)
        return "tick"

    manager = EnvManager(lambda: Countdown(length=100), slow_policy, episode_timeout=0.2)
    [group] = await manager.run([7])
    trajectory = group.trajectories[0]
    assert trajectory.stop_reason is StopReason.TIMEOUT
    assert trajectory.error == "episode exceeded episode_timeout=0.2s"
    assert 1 <= len(trajectory.turns) < 100
    await manager.aclose()
    assert Countdown.closed == Countdown.created


async def test_a_raising_policy_ends_the_episode_as_error_and_keeps_the_env():
    async def flaky_policy(request: PolicyInput) -> str:
        if request.turn == 1:
            raise ValueError("model server went away")
        return "tick"

    manager = EnvManager(Countdown, flaky_policy, max_concurrency=1)
    groups = await manager.run([1, 2])
    for group in groups:
        assert group.trajectories[0].stop_reason is StopReason.ERROR
        assert group.trajectories[0].error == "policy raised ValueError: model server went away"
    assert Countdown.created == 1 and Countdown.closed == 0  # the env was not to blame
    await manager.aclose()


async def test_a_hanging_reset_times_out_and_a_wrong_policy_return_is_an_error():
    class HangingReset(Countdown):
        async def areset(self, *, seed=None, options=None):
            await asyncio.Event().wait()

    async def numeric_policy(request: PolicyInput) -> int:
        return 3

    manager = EnvManager(HangingReset, instant_policy, step_timeout=0.05)
    [group] = await manager.run([1])
    assert group.trajectories[0].stop_reason is StopReason.TIMEOUT
    await manager.aclose()
    manager = EnvManager(Countdown, numeric_policy)  # type: ignore[arg-type]
    [group] = await manager.run([1])
    assert group.trajectories[0].error == "PolicyError: policy returned int, expected PolicyOutput or str"
    await manager.aclose()


async def test_a_failing_env_factory_is_an_error_not_a_crash():
    def broken_factory() -> Env:
        raise OSError("no sandbox available")

    manager = EnvManager(broken_factory, instant_policy)
    [group] = await manager.run([3])
    assert group.trajectories[0].stop_reason is StopReason.ERROR
    assert group.trajectories[0].error == "OSError: no sandbox available"
    await manager.aclose()


async def test_groups_keep_the_first_k_finished_and_cancel_and_count_the_rest():
    delays = [0.3, 0.0, 0.1, 0.05, 0.6]  # by episode index within the group

    async def staggered_policy(request: PolicyInput) -> str:
        await asyncio.sleep(delays[int(request.episode_id.rsplit("-e", 1)[1])])
        return "tick"

    seen: list[Trajectory] = []
    manager = EnvManager(
        lambda: Countdown(length=1), staggered_policy, group_size=3, redundancy=2, on_trajectory=seen.append
    )
    groups = await manager.run([Task(seed=11), Task(seed=12)])
    for group in groups:
        assert [t.episode_id.rsplit("-e", 1)[1] for t in group.trajectories] == ["1", "3", "2"]
        assert {t.seed for t in group.trajectories} == {group.seed}
        assert {t.group_id for t in group.trajectories} == {group.group_id}
        assert group.cancelled == 2
    assert Counter(t.stop_reason for t in seen) == {StopReason.TERMINATED: 6, StopReason.CANCELLED: 4}
    assert manager.stats.by_reason[StopReason.CANCELLED] == 4
    assert_all_accounted(manager)
    await manager.aclose()
    assert_no_leaked_tasks()


class Instant(Env):
    """Never suspends: a whole episode runs inside one step of its task."""

    async def areset(self, *, seed=None, options=None):
        return "start", {}

    async def astep(self, action: str):
        return "end", 1.0, True, False, {}


async def test_stragglers_cancelled_before_they_ever_ran_are_still_counted():
    manager = EnvManager(Instant, instant_policy, group_size=1, redundancy=2)
    groups = await manager.run(range(50))
    assert all(g.cancelled == 2 and len(g.trajectories) == 1 for g in groups)
    assert manager.stats.by_reason[StopReason.CANCELLED] == 100
    assert_all_accounted(manager)
    await manager.aclose()
    assert_no_leaked_tasks()


async def test_a_group_with_failures_completes_once_every_episode_ended():
    manager = EnvManager(lambda: Countdown(faulty=True), instant_policy, group_size=2, redundancy=1)
    [group] = await manager.run([40])  # seed 40 % 20 == 0: every episode of the group raises
    assert [t.stop_reason for t in group.trajectories] == [StopReason.ERROR] * 3
    assert group.cancelled == 0
    await manager.aclose()


async def test_the_task_source_is_pulled_only_when_a_whole_group_fits():
    pulls: list[int] = []

    async def slow_source():
        for seed in range(12):
            await asyncio.sleep(0.01)
            pulls.append(manager.stats.in_flight)
            yield seed

    manager = EnvManager(
        lambda: Countdown(length=2, step_delay=0.02), instant_policy, group_size=2, max_concurrency=5
    )
    groups = []
    async for group in manager.stream(slow_source()):
        groups.append(group)
        assert len(pulls) <= len(groups) + 2  # never more than 2 groups (4 slots of 5) ahead
    assert len(groups) == 12
    assert max(pulls) <= 5 - 2  # each pull happened with room for a whole group
    assert_all_accounted(manager)
    await manager.aclose()


async def test_a_failing_task_source_raises_from_stream_and_leaks_nothing():
    def source():
        yield 1
        raise LookupError("task database unavailable")

    manager = EnvManager(lambda: Countdown(step_delay=0.01), instant_policy)
    with pytest.raises(LookupError, match="task database unavailable"):
        await manager.run(source())
    assert_all_accounted(manager)
    await manager.aclose()
    assert_no_leaked_tasks()


async def test_aclose_aborts_in_flight_episodes_and_leaves_no_tasks():
    manager = EnvManager(lambda: Countdown(length=50, step_delay=0.01), instant_policy, max_concurrency=16)
    stream = manager.stream(itertools.count())
    consumer_groups = 0

    async def consume() -> None:
        nonlocal consumer_groups
        async for _ in stream:
            consumer_groups += 1

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    await manager.aclose()
    await asyncio.wait_for(consumer, 1)  # the blocked consumer is released, not left hanging
    assert manager.stats.by_reason[StopReason.ABORTED] == 16
    assert_all_accounted(manager)
    assert Countdown.closed == Countdown.created
    assert_no_leaked_tasks()
    with pytest.raises(Exception, match="closed"):
        await manager.run([1])


async def test_leaving_the_stream_early_aborts_the_rest():
    async def policy_slower_for_higher_seeds(request: PolicyInput) -> str:
        await asyncio.sleep(0.01 * request.env.seed)
        return "tick"

    async with EnvManager(Countdown, policy_slower_for_higher_seeds, max_concurrency=8) as manager:
        stream = manager.stream(itertools.count())
        async for group in stream:
            assert group.seed == 0
            break
        await stream.aclose()
        assert manager.stats.by_reason[StopReason.ABORTED] == manager.stats.launched - 1 >= 7
        assert_all_accounted(manager)
    assert_no_leaked_tasks()


async def test_turns_record_conversation_tokens_and_timings():
    calls: list[PolicyInput] = []
    ended: list[str] = []

    class TokenPolicy:
        async def __call__(self, request: PolicyInput) -> PolicyOutput:
            calls.append(PolicyInput(request.episode_id, request.turn, list(request.messages), request.env))
            return PolicyOutput(
                text=f"move {request.turn}",
                prompt_token_ids=[1, 2],
                token_ids=[7],
                logprobs=[-0.5],
                versions=[3],
                finish_reason="stop",
            )

        async def end_episode(self, episode_id: str) -> None:
            ended.append(episode_id)

    manager = EnvManager(lambda: Countdown(length=2), TokenPolicy())
    [group] = await manager.run([5])
    trajectory = group.trajectories[0]
    assert calls[0].messages == [
        {"role": "system", "content": "Count down."},
        {"role": "user", "content": "2 left"},
    ]
    assert calls[1].messages[2:] == [
        {"role": "assistant", "content": "move 0"},
        {"role": "user", "content": "1 left"},
    ]
    assert [(t.observation, t.action, t.reward) for t in trajectory.turns] == [
        ("2 left", "move 0", 1.0),
        ("1 left", "move 1", 1.0),
    ]
    assert trajectory.final_observation == "0 left"
    assert trajectory.system_prompt == "Count down."
    assert trajectory.token_ids() == [1, 2, 7, 1, 2, 7]
    assert trajectory.loss_mask() == [0, 0, 1, 0, 0, 1]
    assert trajectory.oldest_version == 3
    assert all(t.policy_seconds >= 0 and t.env_seconds >= 0 for t in trajectory.turns)
    assert trajectory.finished_at >= trajectory.started_at > 0
    assert ended == [trajectory.episode_id]
    await manager.aclose()


async def test_plain_text_turns_share_an_immutable_empty_token_list():
    manager = EnvManager(Countdown, instant_policy)
    [group] = await manager.run([1])
    turn = group.trajectories[0].turns[0]
    assert turn.action_token_ids == [] and turn.action_logprobs == []
    with pytest.raises(TypeError, match="no tokens"):
        turn.action_token_ids.append(1)
    await manager.aclose()


async def test_max_turns_truncates():
    manager = EnvManager(lambda: Countdown(length=10), instant_policy, max_turns=4)
    [group] = await manager.run([1])
    assert group.trajectories[0].stop_reason is StopReason.TRUNCATED
    assert len(group.trajectories[0].turns) == 4
    await manager.aclose()


def test_bad_settings_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="exceeds max_concurrency"):
        EnvManager(Countdown, instant_policy, group_size=8, redundancy=2, max_concurrency=9)
    with pytest.raises(ValueError, match="step_timeout"):
        EnvManager(Countdown, instant_policy, step_timeout=0)
    with pytest.raises(UnknownEnvError):
        EnvManager("nowhere/Nothing-v0", instant_policy)


class SlowGymEnv(gymnasium.Env):
    """A plain synchronous gymnasium env whose step blocks its thread, like a simulator."""

    observation_space = spaces.Discrete(10)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action: Any):
        time.sleep(0.2)
        self.t += 1
        return self.t, 1.0, self.t >= 3, False, {}


async def test_gymnasium_adapter_runs_blocking_envs_off_the_loop():
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    manager = EnvManager(lambda: GymnasiumAdapter(SlowGymEnv()), RandomPolicy(seed=0), max_concurrency=4)
    groups = await manager.run(range(4))
    beat.cancel()
    await asyncio.gather(beat, return_exceptions=True)
    assert all(g.trajectories[0].stop_reason is StopReason.TERMINATED for g in groups)
    assert len(gaps) > 20 and max(gaps) < 0.1  # each step blocks its thread 200 ms; the loop never stalls
    await manager.aclose()


async def test_gymnasium_frozenlake_plays_through_the_manager():
    manager = EnvManager(
        lambda: GymnasiumAdapter("FrozenLake-v1", is_slippery=False),
        RandomPolicy(seed=1),
        max_turns=30,
        group_size=4,
    )
    groups = await manager.run(range(8))
    episodes = [t for g in groups for t in g.trajectories]
    assert len(episodes) == 32
    assert {t.stop_reason for t in episodes} <= {StopReason.TERMINATED, StopReason.TRUNCATED}
    assert all(t.turns[0].action in {"0", "1", "2", "3"} for t in episodes)
    assert_all_accounted(manager)
    await manager.aclose()
