"""The code environments: write a Python function, get graded by hidden tests in a sandbox.

- `CodeEnv` (`code/Python-v0`): multi-turn. The observation is the task; each action is a full
  solution; the env runs it against the hidden tests and answers with the failures, until all
  pass (terminated) or `max_turns` submissions were made (truncated).
- `SingleTurnCodeEnv` (`code/PythonSingleTurn-v0`): one submission, graded, episode over.
- `ToolCodeEnv` (`code/PythonTool-v0`): before its one submission the agent may run scratch code
  with the `run_python` tool (an `agentrl.tools` tool) and read its output, a limited number of
  times.

Rewards: each graded step pays the change in the fraction of tests passed, so an episode's total
reward is the fraction its last submission passed (plus any format penalties). An action with no
code costs `format_penalty` and leaves the task as it was. `reset(seed=s)` plays task
`s % len(tasks)`, so every member of a group plays the same task.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, Literal

from agentrl.core import Env
from agentrl.errors import AgentRLError, ConfigError
from agentrl.sandbox import ExecResult, SandboxPool
from agentrl.tools import ToolResult, format_call, tool
from agentrl_code.answers import extract_code, format_submission
from agentrl_code.grading import GradeReport, grade
from agentrl_code.pools import acquire_shared_pool, release_shared_pool
from agentrl_code.tasks import Difficulty, Task, load_tasks

Backend = Literal["auto", "docker", "process"]
BACKENDS: tuple[str, ...] = ("auto", "docker", "process")
RESET_OPTIONS = ("task_id", "difficulty")

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Each task asks for one Python function. Reply with the "
    "complete solution (the function plus any imports and helpers it needs) in one ```python code "
    "block. Hidden unit tests call the function; if some fail you are shown which, and you may "
    "answer again with a corrected complete solution."
)
SINGLE_TURN_SYSTEM_PROMPT = (
    "You are an expert Python programmer. Each task asks for one Python function. Reply with the "
    "complete solution (the function plus any imports and helpers it needs) in one ```python code "
    "block. Hidden unit tests call the function; you have one attempt."
)
TOOL_SYSTEM_PROMPT = (
    "You are an expert Python programmer. Each task asks for one Python function. You may run "
    "Python code first to try things out: call the run_python tool and you will see the script's "
    "exit code, stdout and stderr. When you are ready, submit the complete solution (the function "
    "plus any imports and helpers it needs) in one ```python code block; hidden unit tests then "
    "grade it and the episode ends."
)


class CodeEnv(Env):
    """Multi-turn Python programming with test feedback (`code/Python-v0`).

    Args:
        backend: sandbox backend, "auto" (Docker if an engine answers, else process),
            "docker" or "process". Envs on one event loop share one pool per backend.
        pool_size: sandboxes in the shared pool, if this env is the one that starts it.
        pool: a started pool to use instead of the shared one (the env never closes it).
        max_turns: submissions allowed before the episode is truncated.
        format_penalty: reward for an action that holds no code.
        difficulty: keep only tasks of these difficulties ("easy", "medium", "hard").
        task_ids: keep only these tasks.
        tasks_path: a TOML file or folder of task files to use instead of the built-in set.
        per_test_timeout: seconds each hidden test may run.
        max_failures_shown: failing tests described in the feedback.
    """

    system_prompt = SYSTEM_PROMPT
    #: True for variants where the first graded submission ends the episode.
    single_submission = False

    def __init__(
        self,
        *,
        backend: Backend = "auto",
        pool_size: int = 4,
        pool: SandboxPool | None = None,
        max_turns: int = 3,
        format_penalty: float = -0.1,
        difficulty: str | Sequence[str] | None = None,
        task_ids: Sequence[str] | None = None,
        tasks_path: str | None = None,
        per_test_timeout: float = 2.0,
        max_failures_shown: int = 5,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        if max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        if per_test_timeout <= 0:
            raise ConfigError(f"per_test_timeout must be positive, got {per_test_timeout}")
        self.backend = backend
        self.pool_size = pool_size
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.per_test_timeout = per_test_timeout
        self.max_failures_shown = max_failures_shown
        self.tasks = _select_tasks(load_tasks(tasks_path), difficulty, task_ids)
        self._given_pool = pool
        self._shared_pool: SandboxPool | None = None
        self.task: Task | None = None
        self.turn = 0
        self.score = 0.0
        self.done = False

    # -- episode ----------------------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Pick a task: `options["task_id"]`, else task `seed % n` among the candidates.

        The candidates are this env's tasks, narrowed by `options["difficulty"]` if given; with
        no seed the pick is random (from `np_random`).
        """
        await super().areset(seed=seed, options=options)
        self.task = self._pick_task(seed, options or {})
        self.turn = 0
        self.score = 0.0
        self.done = False
        return self._task_observation(), self._info()

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        task = self._require_open_episode()
        self.turn += 1
        code = extract_code(action)
        if code is None:
            return self._format_error(
                "No solution found. Put the complete function in a ```python code block."
            )
        report = await self._grade(task, code)
        reward = report.fraction - self.score
        self.score = report.fraction
        terminated = report.all_passed or self.single_submission
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        observation = report.feedback(self.max_failures_shown)
        if report.all_passed:
            observation += "\nAll tests passed."
        elif not self.done:
            observation += "\nFix your code and answer with the complete corrected solution."
        return observation, reward, terminated, truncated, self._info(report)

    async def aclose(self) -> None:
        if self._shared_pool is not None:
            pool, self._shared_pool = self._shared_pool, None
            await release_shared_pool(pool)

    # -- scripted actions ---------------------------------------------------------------------

    def expert_action(self) -> str:
        """The task's reference solution, as a submission."""
        return format_submission(self._require_task().solution)

    def sample_action(self) -> str:
        """A plausible random action: a wrong stub of the function, or prose with no code."""
        task = self._require_task()
        kind = int(self.np_random.integers(3))
        if kind == 0:
            return format_submission(f"def {task.entry_point}(*args, **kwargs):\n    return None")
        if kind == 1:
            echo = f"def {task.entry_point}(*args, **kwargs):\n    return args[0] if args else 0"
            return "Here is my solution:\n" + format_submission(echo)
        return "I think the answer is to loop over the input and return the result."

    # -- helpers --------------------------------------------------------------------------------

    def _task_observation(self) -> str:
        task = self._require_task()
        return f"{task.prompt.strip()}\n\nAnswer with the complete function in a ```python code block."

    def _info(self, report: GradeReport | None = None) -> dict[str, Any]:
        task = self._require_task()
        info: dict[str, Any] = {
            "task_id": task.id,
            "difficulty": task.difficulty.value,
            "turn": self.turn,
            "score": self.score,
            "success": self.score >= 1.0,
        }
        if report is not None:
            info.update(
                tests_passed=report.passed,
                tests_total=report.total,
                timed_out=report.timed_out,
                format_error=False,
            )
        return info

    def _format_error(self, message: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Penalise an action with no code; the task stays open until the turn limit."""
        truncated = self.turn >= self.max_turns
        self.done = truncated
        info = self._info()
        info["format_error"] = True
        return message, self.format_penalty, False, truncated, info

    def _require_open_episode(self) -> Task:
        task = self._require_task()
        if self.done:
            raise AgentRLError(f"{type(self).__name__}: the episode is over; call reset() to start another")
        return task

    def _require_task(self) -> Task:
        if self.task is None:
            raise AgentRLError(f"{type(self).__name__}: call reset() before step()")
        return self.task

    def _pick_task(self, seed: int | None, options: dict[str, Any]) -> Task:
        unknown = set(options) - set(RESET_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown reset options {sorted(unknown)}; known: {', '.join(RESET_OPTIONS)}")
        if "task_id" in options:
            return _select_tasks(self.tasks, None, [options["task_id"]])[0]
        candidates = _select_tasks(self.tasks, options.get("difficulty"), None)
        index = seed % len(candidates) if seed is not None else int(self.np_random.integers(len(candidates)))
        return candidates[index]

    async def _pool(self) -> SandboxPool:
        if self._given_pool is not None:
            return self._given_pool
        if self._shared_pool is None:
            self._shared_pool = await acquire_shared_pool(self.backend, self.pool_size)
        return self._shared_pool

    async def _grade(self, task: Task, code: str) -> GradeReport:
        pool = await self._pool()
        async with pool.acquire() as sandbox:
            return await grade(sandbox, code, task.tests, per_test_timeout=self.per_test_timeout)


class SingleTurnCodeEnv(CodeEnv):
    """One graded submission per episode (`code/PythonSingleTurn-v0`)."""

    system_prompt = SINGLE_TURN_SYSTEM_PROMPT
    single_submission = True

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 1)
        super().__init__(**kwargs)

    def _format_error(self, message: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The one attempt is spent: an answer with no code ends the episode, failed."""
        observation, reward, _, _, info = super()._format_error(message)
        self.done = True
        return observation, reward, True, False, info


class ToolCodeEnv(CodeEnv):
    """A Python tool to try code before the one graded submission (`code/PythonTool-v0`).

    The `run_python` tool runs a script in a sandbox (no hidden tests there) and answers with its
    exit code, stdout and stderr. An action without a tool call is read as the submission. Runs
    beyond `max_tool_calls` are refused (no run, reward 0); the episode is truncated after
    `max_turns` actions, tool calls included. A malformed call costs `tool_error_penalty`.

    Extra args:
        max_tool_calls: tool runs allowed per episode.
        tool_timeout: seconds a tool run may take.
        max_tool_output: characters of stdout and of stderr shown per run.
    """

    system_prompt = TOOL_SYSTEM_PROMPT
    single_submission = True

    def __init__(
        self,
        *,
        max_tool_calls: int = 4,
        tool_timeout: float = 5.0,
        max_tool_output: int = 2000,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_turns", max_tool_calls + 2)
        super().__init__(**kwargs)
        self.max_tool_calls = max_tool_calls
        self.tool_timeout = tool_timeout
        self.max_tool_output = max_tool_output
        self.tool_calls = 0

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self.tool_calls = 0
        return await super().areset(seed=seed, options=options)

    @tool
    async def run_python(self, code: str) -> ToolResult:
        """Run a Python script in a sandbox and see its exit code, stdout and stderr."""
        self._require_open_episode()
        self.turn += 1
        truncated = self.turn >= self.max_turns
        self.done = truncated
        info = self._info() | {"tool_runs": self.tool_calls}
        if self.tool_calls >= self.max_tool_calls:
            info["tool_budget_exceeded"] = True
            message = (
                f"Tool budget spent ({self.max_tool_calls} runs). "
                "Submit your solution in a ```python code block."
            )
            return ToolResult(message, truncated=truncated, info=info)
        self.tool_calls += 1
        info["tool_runs"] = self.tool_calls
        pool = await self._pool()
        async with pool.acquire() as sandbox:
            result = await sandbox.run(
                ["python3", "main.py"], files={"main.py": code}, timeout=self.tool_timeout
            )
        info["tool_exit_code"] = result.exit_code
        return ToolResult(self._tool_observation(result), truncated=truncated, info=info)

    def _task_observation(self) -> str:
        task = self._require_task()
        return (
            f"{task.prompt.strip()}\n\nYou may run code with the run_python tool up to "
            f"{self.max_tool_calls} times, then submit the complete function in a ```python code block."
        )

    def _tool_observation(self, result: ExecResult) -> str:
        cap = self.max_tool_output
        lines = [f"exit code: {result.exit_code}"]
        if result.timed_out:
            lines.append(f"(stopped: ran past the {self.tool_timeout:g}s time limit)")
        if result.memory_exceeded:
            lines.append("(stopped: memory limit exceeded)")
        for name in ("stdout", "stderr"):
            text: str = getattr(result, name)
            shown = text if len(text) <= cap else text[:cap] + f"\n... ({len(text) - cap} more characters)"
            lines.append(f"{name}:\n{shown}" if text else f"{name}: (empty)")
        left = self.max_tool_calls - self.tool_calls
        lines.append(f"({left} tool runs left)")
        return "\n".join(lines)

    def sample_action(self) -> str:
        """Like `CodeEnv.sample_action`, plus tool calls that print something about the task."""
        task = self._require_task()
        if int(self.np_random.integers(2)) == 0:
            code = f"print({task.entry_point!r}, {int(self.np_random.integers(100))})"
            return format_call("run_python", {"code": code})
        return super().sample_action()


def _select_tasks(
    tasks: Sequence[Task], difficulty: str | Sequence[str] | None, task_ids: Sequence[str] | None
) -> list[Task]:
    """Filter `tasks`; unknown ids or difficulties raise `ConfigError` naming close matches."""
    selected = list(tasks)
    if difficulty is not None:
        wanted = {difficulty} if isinstance(difficulty, str) else set(difficulty)
        known = {d.value for d in Difficulty}
        bad = wanted - known
        if bad:
            raise ConfigError(f"unknown difficulty {sorted(bad)}; choose from {sorted(known)}")
        selected = [task for task in selected if task.difficulty.value in wanted]
    if task_ids is not None:
        by_id = {task.id: task for task in selected}
        missing = [task_id for task_id in task_ids if task_id not in by_id]
        if missing:
            hints = difflib.get_close_matches(missing[0], list(by_id), n=3)
            hint = f"; did you mean {', '.join(hints)}?" if hints else ""
            raise ConfigError(f"unknown task id {missing[0]!r}{hint}")
        selected = [by_id[task_id] for task_id in task_ids]
    if not selected:
        raise ConfigError("no task matches the given difficulty and task_ids")
    return selected
