"""Latency and length distributions for modelled workloads: constant, long-tailed, rare-slow.

Agentic rollouts are slow at the tail: most tool calls return fast and a few take minutes, most
responses are short and a few hit the token limit. These are the shapes that make a synchronous
batch wait for its slowest member, so benchmarks describe workloads with them:

    Constant(0.5)                       every sample 0.5
    LogNormal(median=2.0, sigma=1.0)    long tail: p99 ~ 10x the median (capped at `cap`)
    RareSlow(fast=0.2, slow=30.0, p_slow=0.05)   mostly fast, a few very slow
    Empirical([..measured values..])    resample what a real run produced

`parse("lognormal:2,1,60")` builds one from a command-line string.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agentrl.errors import ConfigError


class Distribution(Protocol):
    def sample(self, rng: random.Random) -> float: ...

    def mean(self) -> float: ...


@dataclass(frozen=True)
class Constant:
    value: float

    def sample(self, rng: random.Random) -> float:
        return self.value

    def mean(self) -> float:
        return self.value


@dataclass(frozen=True)
class LogNormal:
    """exp(N(log median, sigma^2)), clipped to [floor, cap]."""

    median: float
    sigma: float
    cap: float = math.inf
    floor: float = 0.0

    def sample(self, rng: random.Random) -> float:
        return min(self.cap, max(self.floor, self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))))

    def mean(self) -> float:
        """Of the uncapped distribution when no cap is set; else estimated by quadrature."""
        if math.isinf(self.cap) and self.floor == 0.0:
            return self.median * math.exp(self.sigma**2 / 2)
        rng = random.Random(0)
        return sum(self.sample(rng) for _ in range(20_000)) / 20_000


@dataclass(frozen=True)
class RareSlow:
    """`fast` with probability 1 - p_slow, else `slow`: tool calls that mostly return at once."""

    fast: float
    slow: float
    p_slow: float

    def sample(self, rng: random.Random) -> float:
        return self.slow if rng.random() < self.p_slow else self.fast

    def mean(self) -> float:
        return self.fast + self.p_slow * (self.slow - self.fast)


@dataclass(frozen=True)
class Empirical:
    """Resamples measured values (e.g. the response lengths of a real run)."""

    values: Sequence[float]

    def sample(self, rng: random.Random) -> float:
        return self.values[rng.randrange(len(self.values))]

    def mean(self) -> float:
        return sum(self.values) / len(self.values)


def parse(spec: str) -> Distribution:
    """`const:V`, `lognormal:MEDIAN,SIGMA[,CAP]` or `rareslow:FAST,SLOW,P_SLOW`."""
    kind, _, args = spec.partition(":")
    try:
        values = [float(v) for v in args.split(",")] if args else []
        if kind == "const" and len(values) == 1:
            return Constant(values[0])
        if kind == "lognormal" and len(values) in (2, 3):
            return LogNormal(*values)
        if kind == "rareslow" and len(values) == 3:
            return RareSlow(*values)
    except ValueError:
        pass
    raise ConfigError(
        f"bad distribution {spec!r}: use const:V, lognormal:MEDIAN,SIGMA[,CAP] or rareslow:FAST,SLOW,P_SLOW"
    )


def sample_int(dist: Distribution, rng: random.Random, low: int = 1) -> int:
    return max(low, round(dist.sample(rng)))
