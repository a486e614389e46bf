"""Reading benchmark profile files: JSON whose `engine` and `trainer` sections fill dataclasses.

The latency-modelled engine (`agentrl.serving.latency_engine.LatencyProfile`) and the simulated
trainer (`agentrl_trainers.sim_trainer.TrainerProfile`) read the same files the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, TypeVar

from agentrl.errors import ConfigError

T = TypeVar("T")


def read_profile(path: str | Path, what: str) -> dict[str, Any]:
    """The whole profile file; `what` names it in the error ("latency", "trainer")."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {what} profile {path}: {exc}") from exc
    return data


def profile_from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build the dataclass `cls` from `data`: every field without a default must be there;
    keys it does not know are ignored (a file may carry notes for other readers)."""
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]  # type: ignore[arg-type]
    if missing:
        raise ConfigError(f"{where} lacks {missing}")
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in known})
