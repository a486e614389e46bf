"""Environment ids -> factories, with lazy discovery of pip-installed suites.

Ids look like `namespace/Name-vN`. A suite makes its envs available by declaring entry points
in the `agentrl.envs` group, one per env id, in its pyproject.toml:

    [project.entry-points."agentrl.envs"]
    "games/Sokoban-v0" = "agentrl_games.sokoban:SokobanEnv"

The entry point's target is an `Env` subclass, any callable returning an `Env`, or an `EnvSpec`
(to carry default keyword arguments). Listing reads only package metadata; a suite's code is
imported the first time one of its envs is made. An id of the form `module:Name-vN` imports
`module` (which is expected to call `register`) and then makes `Name-vN`.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from agentrl.core import Env
from agentrl.errors import EnvLoadError, RegistrationError, UnknownEnvError

ENTRY_POINT_GROUP = "agentrl.envs"
_ID_PATTERN = re.compile(r"^(?:[\w.\-]+/)?[\w.\-]+-v\d+$")

EnvFactory = Callable[..., Env]


@dataclass(frozen=True)
class EnvSpec:
    """How to build one environment id: a factory (or `"module:attr"` path) and default kwargs."""

    id: str
    entry_point: EnvFactory | str
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def make(self, **overrides: Any) -> Env:
        factory = _resolve(self.entry_point) if isinstance(self.entry_point, str) else self.entry_point
        env = factory(**{**self.kwargs, **overrides})
        if not isinstance(env, Env):
            raise EnvLoadError(f"{self.id}: factory returned {type(env).__name__}, not an agentrl.Env")
        return env


_registry: dict[str, EnvSpec] = {}


def register(
    id: str,
    entry_point: EnvFactory | str,
    *,
    override: bool = False,
    description: str = "",
    **default_kwargs: Any,
) -> EnvSpec:
    """Register `id`. Registering an existing id raises unless `override=True`."""
    if not _ID_PATTERN.match(id):
        raise RegistrationError(
            f"Invalid env id {id!r}: expected 'namespace/Name-vN' (e.g. 'games/Sokoban-v0')"
        )
    if id in _registry and not override:
        raise RegistrationError(f"Env id {id!r} is already registered; pass override=True to replace it")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(default_kwargs), description=description)
    _registry[id] = spec
    return spec


def unregister(id: str) -> None:
    _registry.pop(id, None)


def make(id: str, **kwargs: Any) -> Env:
    """Build a new env for `id`, with `kwargs` overriding the registered defaults."""
    return spec(id).make(**kwargs)


def spec(id: str) -> EnvSpec:
    """The `EnvSpec` behind `id`, loading its suite's entry point or module if needed."""
    if id in _registry:
        return _registry[id]
    if ":" in id:
        module_name, _, env_name = id.partition(":")
        _import(module_name, id)
        if env_name in _registry:
            return _registry[env_name]
        raise UnknownEnvError(env_name, _close_matches(env_name))
    entry_point = _entry_points().get(id)
    if entry_point is None:
        raise UnknownEnvError(id, _close_matches(id))
    try:
        target = entry_point.load()
    except Exception as exc:
        raise EnvLoadError(f"Could not load entry point {id!r} -> {entry_point.value}: {exc}") from exc
    if id in _registry:  # importing the suite registered it
        return _registry[id]
    if isinstance(target, EnvSpec):
        _registry[id] = target
        return target
    return register(id, target)


def list_envs() -> list[str]:
    """All known env ids, registered or installed, sorted. Imports no suite."""
    return sorted(set(_registry) | set(_entry_points()))


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _close_matches(id: str) -> list[str]:
    known = list_envs()
    matches = difflib.get_close_matches(id, known, n=3, cutoff=0.5)
    if not matches:  # also match on the name alone, ignoring namespace and version
        bare = id.split("/")[-1].split("-v")[0].lower()
        matches = [k for k in known if bare and bare in k.lower()][:3]
    return matches


def _import(module_name: str, id: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvLoadError(f"Could not import {module_name!r} for env id {id!r}: {exc}") from exc


def _resolve(path: str) -> EnvFactory:
    module_name, _, attr = path.partition(":")
    module = _import(module_name, path)
    try:
        factory: EnvFactory = getattr(module, attr)
    except AttributeError as exc:
        raise EnvLoadError(f"{module_name!r} has no attribute {attr!r}") from exc
    return factory
