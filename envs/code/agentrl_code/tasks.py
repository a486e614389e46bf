"""The task set: Python programming problems with a reference solution and hidden tests.

Tasks live in TOML files next to this module (`tasks/easy.toml`, `tasks/medium.toml`,
`tasks/hard.toml`), one `[[task]]` table each, because TOML's literal multi-line strings hold
code without escaping. `load_tasks()` validates every task when it loads (unique ids, an entry
point that the prompt, the solution and every test mention, at least five tests), so a broken
task fails at import of the task set, not in the middle of training.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterable
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.errors import ConfigError
from agentrl_code.probes import plan_test

MIN_TESTS = 5


class Difficulty(StrEnum):
    EASY = "easy"
    MEDIUM = "medium"
    HARD = "hard"


class Task(BaseModel):
    """One programming problem.

    `prompt` states the function's signature, what it must do and an example; `entry_point` is
    the function's name; each entry of `tests` is a small Python snippet (usually one `assert`)
    run with the candidate's definitions in scope. Its asserts are `assert actual == expected`
    (checked with exact types), `assert actual is True/False/None` or
    `assert raises(ExcType, func, *args)`; `probes.py` says why only these.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    difficulty: Difficulty
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    prompt: str = Field(min_length=20)
    solution: str
    tests: tuple[str, ...] = Field(min_length=MIN_TESTS)

    @field_validator("solution")
    @classmethod
    def _solution_parses(cls, source: str) -> str:
        _parse(source, "solution")
        return source

    @field_validator("tests")
    @classmethod
    def _tests_parse(cls, tests: tuple[str, ...]) -> tuple[str, ...]:
        for index, source in enumerate(tests):
            _parse(source, f"tests[{index}]")
            plan_test(source, index)  # a form the host cannot judge without leaking fails here
        if len(set(tests)) != len(tests):
            raise ValueError("tests contain duplicates")
        return tests

    @model_validator(mode="after")
    def _entry_point_is_used(self) -> Task:
        defined = {node.name for node in ast.parse(self.solution).body if isinstance(node, ast.FunctionDef)}
        if self.entry_point not in defined:
            raise ValueError(f"solution does not define a top-level function {self.entry_point!r}")
        if f"{self.entry_point}(" not in self.prompt:
            raise ValueError(f"prompt does not show the signature {self.entry_point}(...)")
        for index, source in enumerate(self.tests):
            if self.entry_point not in source:
                raise ValueError(f"tests[{index}] does not call {self.entry_point!r}")
        return self


def _parse(source: str, where: str) -> None:
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{where} is not valid Python: {exc.msg} (line {exc.lineno})") from exc


def load_task_file(path: Path | str) -> list[Task]:
    """Read and validate one TOML file of `[[task]]` tables; errors name the file and task."""
    path = Path(path)
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    unknown = set(data) - {"task"}
    if unknown:
        raise ConfigError(f"{path}: unexpected top-level keys {sorted(unknown)} (only [[task]] tables)")
    tasks = []
    for index, raw in enumerate(data.get("task", [])):
        try:
            tasks.append(Task.model_validate(raw))
        except ValidationError as exc:
            name = raw.get("id", f"#{index}") if isinstance(raw, dict) else f"#{index}"
            raise ConfigError(f"{path}: task {name}: {exc}") from exc
    return tasks


def check_unique(tasks: Iterable[Task]) -> list[Task]:
    """The tasks as a list, raising `ConfigError` if two share an id."""
    seen: dict[str, Task] = {}
    for task in tasks:
        if task.id in seen:
            raise ConfigError(f"duplicate task id {task.id!r}")
        seen[task.id] = task
    return list(seen.values())


@functools.cache
def builtin_tasks() -> tuple[Task, ...]:
    """The task set shipped with this package, in a fixed order (easy, medium, hard)."""
    folder = resources.files("agentrl_code") / "tasks"
    tasks: list[Task] = []
    for difficulty in Difficulty:
        with resources.as_file(folder / f"{difficulty.value}.toml") as path:
            loaded = load_task_file(path)
        for task in loaded:
            if task.difficulty != difficulty:
                raise ConfigError(f"{path}: task {task.id} says {task.difficulty}, file is {difficulty}")
        tasks += loaded
    return tuple(check_unique(tasks))


def load_tasks(path: Path | str | None = None) -> list[Task]:
    """The built-in task set, or the tasks of a TOML file / a folder of TOML files at `path`."""
    if path is None:
        return list(builtin_tasks())
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.toml"))
        if not files:
            raise ConfigError(f"{path}: no *.toml task files")
        return check_unique(task for file in files for task in load_task_file(file))
    return check_unique(load_task_file(path))
