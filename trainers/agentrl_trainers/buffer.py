"""The staleness-aware buffer between the environment manager and the trainer.

Producers (`EnvManager.stream`) take their seeds from `buffer.admitted(seeds)` and `await
buffer.put(group)` each finished group; the trainer calls `await buffer.get_batch(n, version)`.

Two rules bound how old training data may be (docs/algorithms.md, "Staleness"):

1. **Admission** (AReaL): a new group may start only while
   `accepted + running < (max_staleness + (version - start_version) + 1) * batch_size`, counted in
   groups, where `accepted` counts groups put and kept (consumed ones included, dropped ones not)
   and `running` the groups admitted but not yet put. Otherwise `admitted()` waits on an
   `asyncio.Condition` that a version bump or a drop notifies: rollout pauses, it never polls.
   `max_staleness=0` is synchronous on-policy: one batch of rollouts per version.
2. **Per group, on consumption**: staleness = trainer version - the oldest policy version among
   the group's sampled tokens; a group over `max_staleness` is dropped and counted. A group
   without token versions (a scripted policy) counts as sampled at the version current when its
   seed was admitted (or when it was put, if its seed was never admitted here).

On `put`, a group with fewer finished episodes than `group_size` (some ended in error or timeout,
and no redundant episode took their place) is dropped whole and counted (`dropped_incomplete`,
or `dropped_no_finished` when none finished): a failed episode is not evidence about the policy,
so it is never scored as an ordinary zero-reward sample, and a group-relative baseline over the
survivors would be computed on a different number of samples than configured. Raising
`env.redundancy` makes the manager complete such groups with spare episodes instead.

With `dynamic_filter`, groups whose rewards are all equal are dropped too: their group-relative
advantages are zero, so they would only dilute the batch (DAPO's dynamic sampling). A policy that
always fails (or always succeeds) then feeds the trainer nothing while rollout runs on: after
`4 * batch_size` such drops in a row the buffer logs a warning, and after `max_filtered_groups`
in a row it stops the run with `TrainingStalled`, saying why and what to change, instead of
waiting forever.

**Tail batching** (RollPacker's idea, applied on the consumption side): a group whose length (the
most action tokens of any of its trajectories) is above the `tail_quantile` of the last
`tail_window` accepted groups is deferred into a tail queue. Ordinary rounds are served from short
groups only; once the tail queue holds a whole batch it is served as a dedicated long round. A tail
group is never deferred past its staleness bound: when the oldest one would turn stale at the next
version, or when nothing else can arrive, the round is filled with tail groups first and short ones
after. Short rounds thus pack with little padding and finish fast, and long rollouts do not hold
them up. With `max_staleness=0` nothing can wait a version, so tail batching has no effect.

**Rollout-side tail batching** (RollPacker's, for synchronous training): with
`speculative_groups=e` (and `max_staleness=0`), rollout runs in rounds, one per version. A short
round admits `batch_size + e` new seeds; the manager (`EnvManager(rollout="batch",
speculative_groups=e)`) ends it once `batch_size` groups completed and hands back the others as
deferred groups (`TrajectoryGroup.deferred`), whose seeds wait in a pool. When the pool holds a
batch, the next round is a long round: `batch_size` pooled seeds re-rolled from scratch with the
current policy and played to the end. Short rounds thus never wait for the long tail, and the
long tail is rolled out together. Nothing is lost: every admitted seed is trained, waits in the
pool, is in flight, or was dropped and counted; re-rolled groups are sampled at the version they
are trained at, like every other group at `max_staleness=0`. When drops leave a round short of a
batch, a make-up round admits just the missing seeds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from agentrl.errors import AgentRLError, InvalidArgumentError
from agentrl.trajectory import TrajectoryGroup

logger = logging.getLogger(__name__)


class TrainingStalled(AgentRLError):
    """Rollouts go on but the buffer's filter keeps dropping every group: no batch can ever form."""


def _stall_error(streak: int, reward: float) -> TrainingStalled:
    return TrainingStalled(
        f"training stalled: buffer.dynamic_filter dropped the last {streak} groups in a row, because "
        f"every episode of each got the same reward ({reward:.3g}), so no batch can form. Warm-start "
        "the policy (sft.episodes) so it sometimes succeeds, make the task easier, or set "
        "buffer.dynamic_filter: false; buffer.max_filtered_batches sets how long to wait before stopping."
    )


@dataclass
class _Entry:
    group: TrajectoryGroup
    oldest_version: int
    length: int


class StalenessBuffer:
    """Holds finished groups until the trainer takes them, within a bound on their staleness."""

    def __init__(
        self,
        batch_size: int,
        max_staleness: int,
        *,
        version: int = 0,
        dynamic_filter: bool = False,
        tail_batching: bool = False,
        tail_quantile: float = 0.9,
        tail_window: int = 256,
        group_size: int | None = None,
        max_filtered_groups: int | None = None,
        speculative_groups: int = 0,
    ) -> None:
        """`group_size`: finished episodes a group must have to be kept (None: any, at least one).
        `max_filtered_groups`: stop with `TrainingStalled` after this many zero-variance drops in a
        row (None: never)."""
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be >= 1 (groups per step), got {batch_size}")
        if max_staleness < 0:
            raise InvalidArgumentError(f"max_staleness must be >= 0 (0 = synchronous), got {max_staleness}")
        if speculative_groups < 0 or (speculative_groups and (max_staleness or tail_batching)):
            raise InvalidArgumentError(
                f"speculative_groups (rollout-side tail batching, {speculative_groups}) must be >= 0 and "
                "needs max_staleness=0 and tail_batching=False: it schedules synchronous rounds"
            )
        if not 0 < tail_quantile < 1:
            raise InvalidArgumentError(f"tail_quantile must be in (0, 1), got {tail_quantile}")
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.dynamic_filter = dynamic_filter
        self.tail_batching = tail_batching
        self.tail_quantile = tail_quantile
        self.group_size = group_size
        self.max_filtered_groups = max_filtered_groups
        self.speculative_groups = speculative_groups
        self._pool: deque[int] = deque()  # deferred seeds waiting for a long round
        self._rounds = 0  # rounds started (one per version)
        self._round_kept_from = 0  # self._accepted when this version's round started
        self._deferred = 0
        self._long_rounds = 0
        self._stalled: TrainingStalled | None = None
        self._cond = asyncio.Condition()
        self._version = version
        self._start_version = version
        self._ready: deque[_Entry] = deque()
        self._tail: deque[_Entry] = deque()
        self._lengths: deque[int] = deque(maxlen=tail_window)
        self._admission_versions: defaultdict[int | None, deque[int]] = defaultdict(deque)
        self._admitted = 0  # seeds handed to producers
        self._finished = 0  # groups put
        self._accepted = 0  # groups put and kept, minus those dropped later
        self._closed = False
        # metrics
        self._staleness: Counter[int] = Counter()
        self._drops: Counter[str] = Counter()
        self._consumed = 0
        self._tail_rounds = 0
        self._unfinished_trajectories = 0
        self._producer_wait = 0.0
        self._consumer_wait = 0.0
        self._last_batch_staleness: list[int] = []
        self._zero_variance_streak = 0

    # ------------------------------------------------------------------ producer side

    async def admitted(self, seeds: Iterable[int]) -> AsyncIterator[int]:
        """Yield seeds from `seeds`, each only when the admission rule lets a new group start
        (with `speculative_groups`: a whole round at once, see the module docstring)."""
        if self.speculative_groups:
            async for seed in self._rounds_of(iter(seeds)):
                yield seed
            return
        for seed in seeds:
            async with self._cond:
                await self._producer_waits_for(self._admission_open)
                if self._closed:
                    return
                self._admitted += 1
                self._admission_versions[seed].append(self._version)
            yield seed

    async def _rounds_of(self, seeds: Iterator[int]) -> AsyncIterator[int]:
        """Rollout-side tail batching: one round per version, short (new seeds, `speculative_groups`
        more than a batch) or long (a batch of deferred seeds); a make-up round when drops left
        this version's round short."""
        while True:
            async with self._cond:
                await self._producer_waits_for(self._round_open)
                if self._closed:
                    return
                round_seeds: list[int]
                if self._rounds > self._version - self._start_version:  # make-up round
                    missing = self.batch_size - (self._accepted - self._round_kept_from)
                    round_seeds = list(itertools.islice(seeds, missing))
                elif len(self._pool) >= self.batch_size:
                    round_seeds = [self._pool.popleft() for _ in range(self.batch_size)]
                    self._long_rounds += 1
                else:
                    round_seeds = list(itertools.islice(seeds, self.batch_size + self.speculative_groups))
                if self._rounds <= self._version - self._start_version:
                    self._rounds += 1
                    self._round_kept_from = self._accepted
                if not round_seeds:
                    return
                self._admitted += len(round_seeds)
                for seed in round_seeds:
                    self._admission_versions[seed].append(self._version)
            for seed in round_seeds:
                yield seed

    async def _producer_waits_for(self, is_open: Callable[[], bool]) -> None:
        """Wait (holding `_cond`) until `is_open()`, counting the time in the producer's wait."""
        if not is_open():
            started = time.perf_counter()
            await self._cond.wait_for(is_open)
            self._producer_wait += time.perf_counter() - started

    def _round_open(self) -> bool:
        """A new round may start once the last one is all in: at a new version, or (make-up) when
        this version's round kept less than a batch."""
        if self._closed:
            return True
        if self.running:
            return False
        if self._rounds <= self._version - self._start_version:
            return True
        return self._accepted - self._round_kept_from < self.batch_size

    async def put(self, group: TrajectoryGroup) -> None:
        """Accept a finished group (or count why it was dropped) and wake the trainer."""
        if group.deferred and (not self.speculative_groups or group.seed is None):
            raise InvalidArgumentError(
                f"deferred group {group.group_id} (seed {group.seed}) cannot be re-rolled: the "
                "buffer needs speculative_groups and the group its seed"
            )
        async with self._cond:
            self._finished += 1
            versions = self._admission_versions.get(group.seed)
            admission_version = versions.popleft() if versions else self._version
            if versions is not None and not versions:
                del self._admission_versions[group.seed]
            if group.deferred and group.seed is not None:
                self._pool.append(group.seed)
                self._deferred += 1
                self._cond.notify_all()
                return
            kept = [t for t in group.trajectories if t.stop_reason.finished][: self.group_size]
            self._unfinished_trajectories += sum(not t.stop_reason.finished for t in group.trajectories)
            if len(kept) != len(group.trajectories):
                group = TrajectoryGroup(group.group_id, group.seed, kept, group.cancelled)
            if not kept:
                self._drops["no_finished"] += 1
            elif self.group_size is not None and len(kept) < self.group_size:
                self._drops["incomplete"] += 1
            elif self.dynamic_filter and np.ptp(group.rewards) == 0:
                self._drops["zero_variance"] += 1
                self._zero_variance_streak += 1
                limit = self.max_filtered_groups
                if limit is not None and self._zero_variance_streak >= limit:
                    self._stalled = _stall_error(self._zero_variance_streak, group.rewards[0])
                if self._zero_variance_streak == 4 * self.batch_size:
                    logger.warning(
                        "dynamic_filter dropped the last %d groups in a row: every trajectory of "
                        "each got the same reward (all %.3g, e.g.), so the trainer gets no data. "
                        "Warm-start the policy (sft.episodes) so it sometimes succeeds, or set "
                        "buffer.dynamic_filter: false.",
                        self._zero_variance_streak,
                        group.rewards[0],
                    )
            else:
                self._zero_variance_streak = 0
                oldest = group.oldest_version
                length = max(t.num_action_tokens for t in kept)
                entry = _Entry(group, admission_version if oldest is None else oldest, length)
                (self._tail if self._is_long(length) else self._ready).append(entry)
                self._lengths.append(length)
                self._accepted += 1
            self._cond.notify_all()

    # ------------------------------------------------------------------ trainer side

    async def get_batch(
        self, num_groups: int | None = None, trainer_version: int | None = None
    ) -> list[TrajectoryGroup]:
        """Wait for and return `num_groups` (default `batch_size`) groups fresh enough for `trainer_version`.

        After `close()`, returns whatever is left (possibly fewer, possibly none) instead of waiting.
        """
        n = num_groups or self.batch_size
        if n > (self.max_staleness + 1) * self.batch_size:
            # Admission never lets more than this many groups be ahead of the trainer at once.
            raise InvalidArgumentError(
                f"num_groups={n} can never be ready: at most (max_staleness + 1) * batch_size = "
                f"{(self.max_staleness + 1) * self.batch_size} groups are admitted ahead of the trainer"
            )
        async with self._cond:
            if trainer_version is not None:
                self._set_version_locked(trainer_version)
            started = time.perf_counter()
            while True:
                if self._stalled is not None:
                    raise self._stalled
                self._drop_stale()
                batch = self._take(n)
                if batch is not None:
                    break
                await self._cond.wait()
            self._consumer_wait += time.perf_counter() - started
            self._last_batch_staleness = [self._version - e.oldest_version for e in batch]
            self._staleness.update(self._last_batch_staleness)
            self._consumed += len(batch)
            return [e.group for e in batch]

    async def set_version(self, version: int) -> None:
        """Tell the buffer the trainer's new version (after pushing weights): admits more rollouts."""
        async with self._cond:
            self._set_version_locked(version)

    async def close(self) -> None:
        """Stop admitting; `get_batch` returns what is left instead of waiting."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ metrics

    @property
    def version(self) -> int:
        return self._version

    @property
    def running(self) -> int:
        """Groups admitted but not yet put."""
        return self._admitted - self._finished

    def metrics(self) -> dict[str, float]:
        """Cumulative counters (drops by reason, staleness histogram, wait seconds) and current sizes."""
        out: dict[str, float] = {
            "buffer/ready": float(len(self._ready)),
            "buffer/tail": float(len(self._tail)),
            "buffer/running": float(self.running),
            "buffer/admitted": float(self._admitted),
            "buffer/consumed": float(self._consumed),
            "buffer/tail_rounds": float(self._tail_rounds),
            "buffer/deferred_groups": float(self._deferred),
            "buffer/long_rounds": float(self._long_rounds),
            "buffer/tail_pool": float(len(self._pool)),
            "buffer/unfinished_trajectories": float(self._unfinished_trajectories),
            "buffer/producer_wait_s": self._producer_wait,
            "buffer/consumer_wait_s": self._consumer_wait,
        }
        for reason in ("stale", "zero_variance", "no_finished", "incomplete"):
            out[f"buffer/dropped_{reason}"] = float(self._drops[reason])
        for staleness, count in sorted(self._staleness.items()):
            out[f"buffer/staleness_{staleness}"] = float(count)
        if self._last_batch_staleness:
            out["buffer/batch_staleness_mean"] = float(np.mean(self._last_batch_staleness))
            out["buffer/batch_staleness_max"] = float(max(self._last_batch_staleness))
        return out

    # ------------------------------------------------------------------ internals (lock held)

    def _capacity(self) -> int:
        return (self.max_staleness + (self._version - self._start_version) + 1) * self.batch_size

    def _admission_open(self) -> bool:
        return self._closed or self._accepted + self.running < self._capacity()

    def _set_version_locked(self, version: int) -> None:
        if version < self._version:
            raise InvalidArgumentError(f"trainer version went backwards: {self._version} -> {version}")
        if version != self._version:
            self._version = version
            self._drop_stale()
            self._cond.notify_all()

    def _is_long(self, length: int) -> bool:
        if not self.tail_batching or len(self._lengths) < 2 * self.batch_size:
            return False
        return length > float(np.quantile(list(self._lengths), self.tail_quantile))

    def _drop_stale(self) -> None:
        dropped = 0
        for queue in (self._ready, self._tail):
            fresh = [e for e in queue if self._version - e.oldest_version <= self.max_staleness]
            dropped += len(queue) - len(fresh)
            queue.clear()
            queue.extend(fresh)
        if dropped:
            self._drops["stale"] += dropped
            self._accepted -= dropped
            self._cond.notify_all()  # the freed slots admit replacements

    def _take(self, n: int) -> list[_Entry] | None:
        """A batch by the tail-batching rule (see the module docstring), or None to keep waiting."""
        if len(self._tail) >= n:
            self._tail_rounds += 1
            return [self._tail.popleft() for _ in range(n)]
        tail_due = any(self._version - e.oldest_version >= self.max_staleness for e in self._tail)
        if len(self._ready) >= n and not tail_due:
            return [self._ready.popleft() for _ in range(n)]
        nothing_coming = self.running == 0 and not self._admission_open()
        enough = len(self._ready) + len(self._tail) >= n
        if self._closed or (enough and (tail_due or nothing_coming)):
            batch = [self._tail.popleft() for _ in range(min(n, len(self._tail)))]
            batch += [self._ready.popleft() for _ in range(min(n - len(batch), len(self._ready)))]
            return batch
        return None
