"""Run thousands of environments concurrently in one asyncio process, each on its own clock.

There is no global turn barrier: every episode is its own asyncio task that resets its env, asks
the policy, steps, and repeats until the episode ends, so one slow env (a long sandbox run, a
slow page) holds up nobody else. Episodes come in groups that share a seed, for group-relative
advantages; a group may launch redundant episodes and keep the first `group_size` to finish.

Accounting is strict: every launched episode ends with exactly one `StopReason` and is counted in
`EnvManager.stats` (and passed to `on_trajectory`), whether it finished, raised, timed out, was a
cancelled redundant rollout, or was aborted by shutdown.

    manager = EnvManager("games/Sokoban-v0", policy, group_size=8, redundancy=2)
    async for group in manager.stream(seeds):     # seeds: any (async) iterable of ints/Tasks
        buffer.add(group)
    await manager.aclose()

Rollout modes. `rollout="async"` (the default) is the env-level asynchronous mode above.
`rollout="batch"` is the synchronous batch-level baseline most RL systems and the papers compare
against: the feeder pulls `batch_groups` tasks, launches all their episodes together, and at every
turn each live episode of the batch waits for all the others twice, once with its observation
(so the policy sees the whole batch at once) and once with its action (so envs step together);
the next batch starts only when every episode of this one has ended. It runs the same episode code,
so a comparison of the two measures the scheduling and nothing else. `rollout="rounds"` keeps the
batches (rounds) but drops the lockstep: inside a round every episode runs on its own clock, as
continuous batching and streamed rewards do in synchronous systems such as RollPacker.
With `speculative_groups`, "batch" or "rounds" does rollout-side tail batching (RollPacker): a
batch with more tasks than `batch_groups` (a short round; with `redundancy`, more episodes per
group too) ends once `batch_groups` groups completed, and its unfinished groups come out as
deferred (`TrajectoryGroup.deferred`, no trajectories) for their tasks to be re-rolled together
later (`StalenessBuffer(speculative_groups=...)` schedules those long rounds).

Back-pressure: `stream` pulls the next task from its source only once it has room for a whole
group (`group_size + redundancy` free episode slots out of `max_concurrency`), so a source that
blocks (a staleness buffer holding rollouts back) is never read ahead of capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl import registry
from agentrl.core import ChatMessage, Env
from agentrl.errors import AgentRLError, InvalidArgumentError, PolicyError
from agentrl.rollout.protocol import Policy, PolicyInput, PolicyOutput
from agentrl.tools import ToolCall, ToolResult, parse_tool_calls
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One unit of work: every episode of its group is reset with this seed and these options."""

    seed: int | None
    options: dict[str, Any] | None = None
    # The group's id; None lets the manager number it. A distributed task queue names its leases
    # here, so a finished group says which lease it settles.
    group_id: str | None = None


@dataclass
class ManagerStats:
    """Counters over the manager's lifetime. `launched == ended + in_flight` at every moment."""

    launched: int = 0
    env_steps: int = 0
    tool_calls: int = 0
    groups_launched: int = 0
    groups_completed: int = 0
    groups_deferred: int = 0  # tail batching: cut off unfinished, emitted as deferred (re-rolled later)
    by_reason: dict[StopReason, int] = field(default_factory=lambda: dict.fromkeys(StopReason, 0))

    @property
    def ended(self) -> int:
        return sum(self.by_reason.values())

    @property
    def in_flight(self) -> int:
        return self.launched - self.ended

    @property
    def finished(self) -> int:
        """Episodes the env itself ended (terminated or truncated): usable as training data."""
        return self.by_reason[StopReason.TERMINATED] + self.by_reason[StopReason.TRUNCATED]

    def as_dict(self) -> dict[str, int]:
        counts = {
            "launched": self.launched,
            "in_flight": self.in_flight,
            "env_steps": self.env_steps,
            "tool_calls": self.tool_calls,
            "groups_launched": self.groups_launched,
            "groups_completed": self.groups_completed,
            "groups_deferred": self.groups_deferred,
        }
        return counts | {reason.value: n for reason, n in self.by_reason.items()}


TrajectoryHook = Callable[[Trajectory], None]

_END = object()  # the task source is exhausted and every group has been emitted

RolloutMode = Literal["async", "batch", "rounds"]
ROLLOUT_MODES: tuple[RolloutMode, ...] = ("async", "batch", "rounds")


class _TurnBarrier:
    """Holds the live episodes of one synchronous batch until all of them reach the same point.

    Episodes that end leave it (`leave`), so the remaining ones are not held for them; an episode
    cancelled while it waits (a redundant straggler, shutdown) takes its arrival back.
    """

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self._released = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self._release()
            return
        released = self._released
        try:
            await released.wait()
        except asyncio.CancelledError:
            if released is self._released:  # still waiting: this arrival no longer counts
                self.arrived -= 1
            raise

    def leave(self) -> None:
        self.parties -= 1
        if self.arrived and self.arrived >= self.parties:
            self._release()

    def _release(self) -> None:
        self.arrived = 0
        self._released.set()
        self._released = asyncio.Event()


@dataclass(eq=False)
class _Run:
    """The state of one `stream()` call."""

    out: asyncio.Queue[Any]
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    feeder: asyncio.Task[None] | None = None
    open_groups: int = 0
    exhausted: bool = False
    closing: bool = False


@dataclass(eq=False)
class _Batch:
    """rollout="batch" or "rounds": the groups played together, and when the batch is over."""

    barrier: _TurnBarrier | None  # rollout="batch": holds the batch's episodes in lockstep
    left: int  # episodes of the batch not yet ended
    quota: int | None  # tail batching: groups to complete before the others are deferred
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when its last episode ended
    groups: list[_Group] = field(default_factory=list)
    completed: int = 0


@dataclass(eq=False)
class _Group:
    group_id: str
    task: Task
    width: int  # episodes launched: group_size, plus the redundant ones where they run
    running: dict[asyncio.Task[None], Trajectory] = field(default_factory=dict)
    kept: list[Trajectory] = field(default_factory=list)
    failed: list[Trajectory] = field(default_factory=list)
    ended: int = 0
    cancelled: int = 0
    emitted: bool = False
    batch: _Batch | None = None  # rollout="batch" or "rounds": the batch it plays in

    @property
    def barrier(self) -> _TurnBarrier | None:
        return self.batch.barrier if self.batch is not None else None


class EnvManager:
    """Plays episodes of one env id (or factory) against one policy, many at a time.

    Args:
        env: a registered env id, or a zero-argument callable returning an `Env`.
        policy: async callable `PolicyInput -> PolicyOutput | str`.
        group_size: finished episodes kept per task (all played with the task's seed).
        redundancy: extra episodes launched per group; the slowest are cancelled and counted.
        max_concurrency: episodes in flight at once (per `stream` call).
        max_turns: manager-side turn limit; reaching it ends the episode as TRUNCATED.
        step_timeout: seconds allowed for one env call (`areset`/`astep`, not the policy).
        episode_timeout: seconds allowed for a whole episode, policy time included.
        env_kwargs: keyword arguments for every env construction.
        on_trajectory: called (synchronously) with every trajectory that ends, whatever its
            stop reason; for metrics and progress bars.
        close_timeout: seconds allowed for `env.aclose()` and `policy.end_episode()`.
        rollout: "async" (each episode on its own clock), "batch" (the synchronous
            batch-level baseline) or "rounds" (batches without lockstep turns): see the module
            docstring.
        batch_groups: rollout="batch" or "rounds" only: groups per batch (a training step's
            worth; its episodes, `batch_groups * (group_size + redundancy)`, must fit
            `max_concurrency`).
        speculative_groups: rollout="batch" or "rounds" only: rollout-side tail batching
            (RollPacker). A batch may take up to `batch_groups + speculative_groups` tasks; one that took more
            than `batch_groups` ends as soon as `batch_groups` of its groups completed, and each
            other group is cut off (its episodes CANCELLED) and emitted as a deferred
            `TrajectoryGroup` (`deferred=True`, no trajectories) for its task to be re-rolled
            later. RollPacker speculates on responses too: with `redundancy`, a short round's
            groups keep their first `group_size` episodes. A batch of at most `batch_groups`
            tasks (a long round of re-rolled tasks) speculates on nothing: it launches
            `group_size` episodes per group and plays them to the end. Which tasks a batch gets
            is the source's choice (`StalenessBuffer(speculative_groups=...)` schedules short
            and long rounds).

    Env instances are reused across episodes through an idle pool (they may hold connections
    or sandboxes); an env that raised, timed out, or was interrupted mid-call is closed and
    replaced. A synchronous env that blocks the event loop cannot be timed out: wrap it in
    `GymnasiumAdapter` so its calls run in a thread.
    """

    def __init__(
        self,
        env: str | Callable[[], Env],
        policy: Policy,
        *,
        group_size: int = 1,
        redundancy: int = 0,
        max_concurrency: int = 256,
        max_turns: int | None = None,
        step_timeout: float | None = None,
        episode_timeout: float | None = None,
        env_kwargs: dict[str, Any] | None = None,
        on_trajectory: TrajectoryHook | None = None,
        close_timeout: float = 10.0,
        rollout: RolloutMode = "async",
        batch_groups: int = 1,
        speculative_groups: int = 0,
    ) -> None:
        if rollout not in ROLLOUT_MODES:
            raise InvalidArgumentError(f"rollout must be one of {ROLLOUT_MODES}, got {rollout!r}")
        if batch_groups < 1:
            raise InvalidArgumentError(f"batch_groups must be >= 1, got {batch_groups}")
        if speculative_groups < 0 or (speculative_groups and rollout == "async"):
            raise InvalidArgumentError(
                f"speculative_groups must be >= 0 and needs rollout 'batch' or 'rounds', got "
                f"{speculative_groups} with rollout={rollout!r}"
            )
        batch_tasks = batch_groups + speculative_groups
        if rollout != "async" and batch_tasks * (group_size + redundancy) > max_concurrency:
            raise InvalidArgumentError(
                f"rollout={rollout!r} runs (batch_groups + speculative_groups) * (group_size + redundancy) = "
                f"{batch_tasks * (group_size + redundancy)} episodes at once, more than "
                f"max_concurrency ({max_concurrency})"
            )
        if group_size < 1 or redundancy < 0:
            raise InvalidArgumentError(
                f"group_size must be >= 1 and redundancy >= 0, got {group_size}, {redundancy}"
            )
        if group_size + redundancy > max_concurrency:
            raise InvalidArgumentError(
                f"group_size + redundancy ({group_size + redundancy}) exceeds max_concurrency "
                f"({max_concurrency}): a group could never start"
            )
        for name, value in (
            ("max_turns", max_turns),
            ("step_timeout", step_timeout),
            ("episode_timeout", episode_timeout),
        ):
            if value is not None and value <= 0:
                raise InvalidArgumentError(f"{name} must be positive or None, got {value}")
        kwargs = dict(env_kwargs or {})
        if isinstance(env, str):
            env_spec = registry.spec(env)  # fail fast (with suggestions) on an unknown id
            self.env_id = env
            self._make_env: Callable[[], Env] = functools.partial(env_spec.make, **kwargs)
        else:
            self.env_id = getattr(env, "__qualname__", type(env).__qualname__)
            self._make_env = functools.partial(env, **kwargs) if kwargs else env
        self.policy = policy
        self.group_size = group_size
        self.width = group_size + redundancy
        self.max_concurrency = max_concurrency
        self.max_turns = max_turns
        self.step_timeout = step_timeout
        self.episode_timeout = episode_timeout
        self.on_trajectory = on_trajectory
        self.close_timeout = close_timeout
        self.rollout = rollout
        self.batch_groups = batch_groups
        self.speculative_groups = speculative_groups
        self.stats = ManagerStats()
        self._end_episode = getattr(policy, "end_episode", None)
        self._idle: list[Env] = []
        self._runs: set[_Run] = set()
        self._prefix = uuid.uuid4().hex[:8]
        self._group_counter = 0
        self._closed = False

    # -- public API -----------------------------------------------------------------------

    async def stream(
        self, tasks: AsyncIterable[int | Task] | Iterable[int | Task]
    ) -> AsyncIterator[TrajectoryGroup]:
        """Yield each group as soon as it completes (not in task order).

        A group completes when `group_size` of its episodes finished (terminated/truncated), or
        when all its episodes ended. Its `trajectories` are the kept finished episodes followed
        by any that ended in ERROR or TIMEOUT (filter on `t.stop_reason.finished` for training);
        `cancelled` counts the redundant episodes dropped. Leaving the loop early, or
        `aclose()`, aborts the episodes still running (StopReason.ABORTED).
        """
        if self._closed:
            raise AgentRLError("EnvManager is closed")
        run = _Run(out=asyncio.Queue())
        self._runs.add(run)
        run.feeder = asyncio.create_task(self._feed(run, tasks))
        try:
            while True:
                item = await run.out.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
            # let the last episodes finish their cleanup (env back to the pool; stragglers counted)
            await asyncio.gather(*run.tasks, return_exceptions=True)
        finally:
            await self._abort(run)
            self._runs.discard(run)

    async def run(self, tasks: AsyncIterable[int | Task] | Iterable[int | Task]) -> list[TrajectoryGroup]:
        """Play every task and return the groups (in completion order)."""
        return [group async for group in self.stream(tasks)]

    async def aclose(self) -> None:
        """Abort running episodes (counted as ABORTED), close every env. Leaves no task behind."""
        self._closed = True
        for run in list(self._runs):
            await self._abort(run)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._close_env(env) for env in idle))

    async def __aenter__(self) -> EnvManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- scheduling -----------------------------------------------------------------------

    async def _feed(self, run: _Run, tasks: AsyncIterable[int | Task] | Iterable[int | Task]) -> None:
        """Pull a task only when a whole group fits, then launch its episodes."""
        slots = asyncio.Semaphore(self.max_concurrency)
        try:
            is_async = isinstance(tasks, AsyncIterable)
            source: Any = aiter(tasks) if is_async else iter(tasks)  # type: ignore[arg-type]
            if self.rollout != "async":
                await self._feed_batches(run, source, is_async, slots)
            while self.rollout == "async":
                for _ in range(self.width):
                    await slots.acquire()
                try:
                    item = await anext(source) if is_async else next(source)
                except (StopAsyncIteration, StopIteration):
                    break
                self._launch_group(run, _as_task(item), slots)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the task source failed: surface it to the consumer
            run.out.put_nowait(exc)
            return
        run.exhausted = True
        if run.open_groups == 0:
            run.out.put_nowait(_END)

    async def _feed_batches(self, run: _Run, source: Any, is_async: bool, slots: asyncio.Semaphore) -> None:
        """rollout="batch"/"rounds": take up to `batch_groups` tasks, play them (in lockstep for
        "batch"), wait for all to end.

        A batch is the tasks the source has ready: the first is awaited, the rest are taken only
        while the source yields without waiting. A source that holds tasks back until groups come
        out (a staleness buffer replacing groups it dropped) thus gets a smaller batch instead of
        a deadlock; the task it was about to yield starts the next batch.
        """
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                tasks: list[Task] = []
                while len(tasks) < self.batch_groups + self.speculative_groups:
                    item: Any
                    if not is_async:
                        item = next(source, _END)
                    else:
                        if pending is None:
                            pending = asyncio.ensure_future(anext(source, _END))
                        if tasks and not pending.done():
                            await asyncio.sleep(0)  # let the source run up to its next wait
                            if not pending.done():
                                break  # it would wait: play the batch we have
                        item = await pending
                        pending = None
                    if item is _END:
                        break
                    tasks.append(_as_task(item))
                if not tasks:
                    return
                quota = self.batch_groups if len(tasks) > self.batch_groups else None
                # tail batching speculates only in short rounds: a long round keeps every episode
                width = self.group_size if self.speculative_groups and quota is None else self.width
                for _ in range(len(tasks) * width):
                    await slots.acquire()
                episodes = len(tasks) * width
                barrier = _TurnBarrier(episodes) if self.rollout == "batch" else None
                batch = _Batch(barrier, episodes, quota)
                for task in tasks:
                    self._launch_group(run, task, slots, batch=batch, width=width)
                await batch.done.wait()
        finally:
            if pending is not None:
                pending.cancel()

    def _launch_group(
        self,
        run: _Run,
        task: Task,
        slots: asyncio.Semaphore,
        *,
        batch: _Batch | None = None,
        width: int | None = None,
    ) -> None:
        self._group_counter += 1
        group = _Group(
            group_id=task.group_id or f"{self._prefix}-g{self._group_counter}",
            task=task,
            width=width or self.width,
            batch=batch,
        )
        if batch is not None:
            batch.groups.append(group)
        run.open_groups += 1
        self.stats.groups_launched += 1
        for index in range(group.width):
            trajectory = Trajectory(
                episode_id=f"{group.group_id}-e{index}",
                env_id=self.env_id,
                group_id=group.group_id,
                seed=task.seed,
                started_at=time.time(),
            )
            episode = asyncio.create_task(self._episode(run, group, trajectory, slots, index))
            group.running[episode] = trajectory
            run.tasks.add(episode)
            episode.add_done_callback(functools.partial(self._episode_done, run, group, trajectory, slots))
            self.stats.launched += 1

    def _episode_done(
        self,
        run: _Run,
        group: _Group,
        trajectory: Trajectory,
        slots: asyncio.Semaphore,
        episode: asyncio.Task[None],
    ) -> None:
        """Account an episode whose task was cancelled before it ever ran (its body never saw it)."""
        run.tasks.discard(episode)
        if not trajectory.finished_at:
            trajectory.finished_at = time.time()
            self._finish(run, group, trajectory, episode)
            slots.release()

    def _finish(self, run: _Run, group: _Group, trajectory: Trajectory, episode: asyncio.Task[None]) -> None:
        """Account an ended episode; complete its group (cancelling stragglers) when it can."""
        del group.running[episode]
        reason = trajectory.stop_reason
        self.stats.by_reason[reason] += 1
        group.ended += 1
        batch = group.batch
        if batch is not None:
            if batch.barrier is not None:
                batch.barrier.leave()
            batch.left -= 1
            if batch.left == 0:
                batch.done.set()
        if self.on_trajectory is not None:
            try:
                self.on_trajectory(trajectory)
            except Exception:
                logger.exception("on_trajectory hook raised; continuing")
        if group.emitted or run.closing:
            return
        if reason.finished:
            group.kept.append(trajectory)
        elif reason in (StopReason.ERROR, StopReason.TIMEOUT):
            group.failed.append(trajectory)
        if len(group.kept) < self.group_size and group.ended < group.width:
            return
        self._cancel_stragglers(group)
        self.stats.groups_completed += 1
        self._emit(
            run, TrajectoryGroup(group.group_id, group.task.seed, group.kept + group.failed, group.cancelled)
        )
        if batch is not None and batch.quota is not None:
            batch.completed += 1
            if batch.completed == batch.quota:
                self._defer_rest(run, batch)

    def _defer_rest(self, run: _Run, batch: _Batch) -> None:
        """Tail batching: the batch has its quota; cut off its unfinished groups as deferred."""
        for other in batch.groups:
            if other.emitted:
                continue
            self._cancel_stragglers(other)
            self.stats.groups_deferred += 1
            # every episode of it is discarded, finished ones too: the long round replays the task whole
            self._emit(run, TrajectoryGroup(other.group_id, other.task.seed, [], other.width, deferred=True))

    def _cancel_stragglers(self, group: _Group) -> None:
        group.emitted = True
        for straggler, other in group.running.items():
            if not other.finished_at:  # still playing (or not yet started)
                other.stop_reason = StopReason.CANCELLED
                straggler.cancel()
                group.cancelled += 1

    def _emit(self, run: _Run, group: TrajectoryGroup) -> None:
        run.out.put_nowait(group)
        run.open_groups -= 1
        if run.exhausted and run.open_groups == 0:
            run.out.put_nowait(_END)

    async def _abort(self, run: _Run) -> None:
        """Stop a stream: cancel its feeder and episodes (ABORTED) and wait for them."""
        run.closing = True
        pending = [t for t in (run.feeder, *run.tasks) if t is not None and not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        run.out.put_nowait(_END)  # wake a consumer blocked on this run

    # -- one episode ----------------------------------------------------------------------

    async def _episode(
        self, run: _Run, group: _Group, trajectory: Trajectory, slots: asyncio.Semaphore, index: int
    ) -> None:
        env: Env | None = None
        env_call = _EnvCall()
        try:
            episode_deadline = asyncio.timeout(self.episode_timeout)
            try:
                async with episode_deadline:
                    env_call.busy = True  # building the env counts as an env call
                    env = self._idle.pop() if self._idle else self._make_env()
                    await self._play(env, group.task, trajectory, env_call, index, group.barrier)
            except TimeoutError as exc:
                trajectory.stop_reason = StopReason.TIMEOUT
                if episode_deadline.expired():
                    trajectory.error = f"episode exceeded episode_timeout={self.episode_timeout}s"
                elif env_call.busy and self.step_timeout is not None:
                    trajectory.error = f"env call exceeded step_timeout={self.step_timeout}s"
                else:
                    trajectory.error = f"TimeoutError: {exc}"
            except Exception as exc:
                trajectory.stop_reason = StopReason.ERROR
                trajectory.error = (
                    str(exc) if isinstance(exc, _PolicyFailed) else f"{type(exc).__name__}: {exc}"
                )
        except asyncio.CancelledError:  # a redundant straggler (CANCELLED) or shutdown (ABORTED)
            _uncancel()
        trajectory.finished_at = time.time()
        self._finish(run, group, trajectory, asyncio.current_task())  # type: ignore[arg-type]
        await self._cleanup(trajectory.episode_id, env, reusable=not env_call.busy)
        slots.release()

    async def _play(
        self,
        env: Env,
        task: Task,
        trajectory: Trajectory,
        env_call: _EnvCall,
        index: int,
        barrier: _TurnBarrier | None = None,
    ) -> None:
        """The episode loop. Sets the trajectory's stop reason when the episode ends normally.

        Raises whatever the env or the policy raises (a policy's exception wrapped in
        `_PolicyFailed`); `env_call.busy` is True exactly while an env call is awaited. With a
        `barrier` (rollout="batch"), each turn waits for the batch before the policy call and
        again before the env step.
        """
        step_timeout = self.step_timeout
        if step_timeout is None:
            observation, _ = await env.areset(seed=task.seed, options=task.options)
        else:
            async with asyncio.timeout(step_timeout):
                observation, _ = await env.areset(seed=task.seed, options=task.options)
        messages: list[ChatMessage] = []
        if env.system_prompt:
            messages.append({"role": "system", "content": env.system_prompt})
        messages.append(env.observation_message(observation))
        trajectory.system_prompt = env.system_prompt
        env_call.busy = False
        tools = [spec.openai() for spec in env.tools()] or None
        policy = self.policy
        turns = trajectory.turns
        stats = self.stats
        clock = time.perf_counter
        max_turns = self.max_turns or sys.maxsize
        episode_id = trajectory.episode_id
        stop = StopReason.TRUNCATED
        for turn_index in range(max_turns):
            if barrier is not None:
                await barrier.wait()
            started = clock()
            try:
                request = PolicyInput(episode_id, turn_index, messages, env, task.seed, index, tools)
                output = await policy(request)
            except TimeoutError:  # the policy's own turn deadline: the episode ends as TIMEOUT
                raise
            except Exception as exc:
                raise _PolicyFailed(exc) from exc
            if isinstance(output, str):
                text = output
                output = _TEXT_ONLY
            elif isinstance(output, PolicyOutput):
                text = output.text
            else:
                raise PolicyError(f"policy returned {type(output).__name__}, expected PolicyOutput or str")
            acted = clock()
            parsed = parse_tool_calls(text, f"call_{turn_index}_") if tools else None
            if barrier is not None:
                await barrier.wait()
            stepping = clock()
            env_call.busy = True
            if parsed is not None and parsed.calls:
                tool_turn = await self._call_tools(env, parsed.calls)
                next_observation, reward, terminated, truncated, info, replies = tool_turn
            elif step_timeout is None:
                next_observation, reward, terminated, truncated, info = await env.astep(text)
            else:
                async with asyncio.timeout(step_timeout):
                    next_observation, reward, terminated, truncated, info = await env.astep(text)
            env_call.busy = False
            if parsed is None or not parsed.calls:
                stats.env_steps += 1
                replies = [env.observation_message(next_observation)]
            turns.append(
                Turn(
                    observation,
                    text,
                    float(reward),
                    info,
                    output.prompt_token_ids,
                    output.token_ids,
                    output.logprobs,
                    output.versions,
                    output.finish_reason,
                    acted - started,
                    clock() - stepping,
                )
            )
            observation = next_observation
            if terminated:
                stop = StopReason.TERMINATED
                break
            if truncated:
                break
            if parsed is not None and parsed.calls:
                calls = [call.openai() for call in parsed.calls]
                messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
            else:
                messages.append({"role": "assistant", "content": text})
            messages.extend(replies)
        trajectory.final_observation = observation
        trajectory.stop_reason = stop

    async def _call_tools(
        self, env: Env, calls: list[ToolCall]
    ) -> tuple[str, float, bool, bool, dict[str, Any], list[ChatMessage]]:
        """Run a turn's calls in order; return it as a step: (observation, reward, terminated,
        truncated, info) plus one `tool` message per call.

        Every call gets an answer, malformed ones included (`Env.call_tool` turns them into an
        error message and the env's penalty). A call that ends the episode stops the rest: they
        are answered "not run" so no call goes unanswered in the conversation.
        """
        replies: list[ChatMessage] = []
        reward, terminated, truncated = 0.0, False, False
        info: dict[str, Any] = {"tool_calls": [], "format_error": False}
        for call in calls:
            if terminated or truncated:
                result = ToolResult("Error: not run, the episode ended at an earlier call")
            elif self.step_timeout is None:
                result = await env.call_tool(call)
            else:
                async with asyncio.timeout(self.step_timeout):
                    result = await env.call_tool(call)
            self.stats.tool_calls += 1
            reward += float(result.reward)
            terminated, truncated = terminated or result.terminated, truncated or result.truncated
            info["format_error"] = info["format_error"] or bool(result.info.get("format_error"))
            info |= {k: v for k, v in result.info.items() if k not in ("tool_error", "format_error")}
            record = {"id": call.id, "name": call.name, "arguments": call.arguments, "result": result.content}
            info["tool_calls"].append(record | {"error": result.info.get("tool_error")})
            replies.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.content}
            )
        observation = "\n\n".join(reply["content"] for reply in replies)
        return observation, reward, terminated, truncated, info, replies

    async def _cleanup(self, episode_id: str, env: Env | None, *, reusable: bool) -> None:
        """Free the policy's episode state and return the env to the pool (or close it)."""
        if self._end_episode is not None:
            try:
                async with asyncio.timeout(self.close_timeout):
                    await self._end_episode(episode_id)
            except asyncio.CancelledError:
                _uncancel()
            except Exception:
                logger.exception("policy.end_episode(%s) failed", episode_id)
        if env is None:
            return
        if reusable and not self._closed:
            self._idle.append(env)
        else:
            await self._close_env(env)

    async def _close_env(self, env: Env) -> None:
        try:
            async with asyncio.timeout(self.close_timeout):
                await env.aclose()
        except asyncio.CancelledError:
            _uncancel()
        except Exception:
            logger.warning("closing %r failed", env, exc_info=True)


class _NoTokens(list):  # type: ignore[type-arg]
    """One shared, immutable empty token list for turns whose policy returned plain text.

    Why: `Turn` would otherwise allocate four empty lists per step; at 4096 concurrent
    episodes those were ~80% of the objects the cyclic GC scans and tripled the per-step cost.
    Mutating it raises instead of silently changing every such turn.
    """

    def _frozen(self, *args: object) -> None:
        raise InvalidArgumentError("this turn has no tokens; assign a new list instead of mutating it")

    append = extend = insert = __setitem__ = __iadd__ = __imul__ = _frozen  # type: ignore[assignment]


_NO_TOKENS = _NoTokens()
_TEXT_ONLY = PolicyOutput("", _NO_TOKENS, _NO_TOKENS, _NO_TOKENS, _NO_TOKENS)


class _EnvCall:
    """Whether an env call is in progress: an env interrupted mid-call is closed, not reused."""

    __slots__ = ("busy",)

    def __init__(self) -> None:
        self.busy = False


class _PolicyFailed(Exception):
    """Marks an exception raised by the policy, so the env is not blamed (and is reused)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"policy raised {type(cause).__name__}: {cause}")


def _as_task(item: int | Task) -> Task:
    if isinstance(item, Task):
        return item
    if isinstance(item, int):
        return Task(seed=item)
    kind = type(item).__name__
    raise InvalidArgumentError(f"a task source must yield int seeds or Task objects, got {kind}")


def _uncancel() -> None:
    """Acknowledge a cancellation we handled, so later timeouts in this task behave normally."""
    task = asyncio.current_task()
    if task is not None:
        with contextlib.suppress(AttributeError):
            task.uncancel()
