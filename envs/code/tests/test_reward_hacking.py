"""Rewards that cannot be forged: every hack of the corpus scores 0, honest code still scores 1.

On both backends. What runs where (see reward_hacks.py for the corpus):
- every hack that attacks the grader from inside the candidate's process (forged reports,
  patched builtins/os/json, always-equal objects, early exits, SystemExit, killing the harness,
  signalling every process, rewriting the harness, walking frames, scanning gc, and the exploit
  of issue 17: frames -> report channel -> a forged pass for every test) against every one
  of the 60 tasks (so every test form: equality, `is`, `raises`, inputs left alone, loops,
  unpacking), 4 submissions in flight through one pool; on Docker the five that end or signal
  the harness run against one task per test form and difficulty instead (`DISRUPTIVE`);
- the secret-marker task, whose expected values are unmistakable text: every searcher (frames,
  gc, /proc of every process, every descriptor, every file, ptrace) looks for them inside the
  sandbox while its submission is graded, and must find nothing (the last four only run here:
  on the 60 tasks they would look for nothing, for seconds per submission);
- the same search as a `code/PythonTool-v0` tool call, after a grading ran in the same sandbox;
- honest solutions that print, use threads or read their own source pass every task.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from agentrl_code.env import ToolCodeEnv
from agentrl_code.grading import GradeReport, grade
from agentrl_code.probes import plan_tests
from agentrl_code.tasks import Task, builtin_tasks
from code_suite_helpers import require_docker
from reward_hacks import (
    HACKS,
    HONEST_WRAPPERS,
    LEAK_MARKER,
    MARKER_TASK_SOLUTION,
    MARKER_TASK_TESTS,
    SEARCH,
    SEARCH_HACKS,
    SEARCHERS,
    hack_solution,
    honest_solution,
)

from agentrl.sandbox import WarmPool, create_pool
from agentrl.tools import ToolCall

pytestmark = pytest.mark.asyncio(loop_scope="module")

PER_TEST_TIMEOUT = 1.0
MARKER_TOML = f"""
[[task]]
id = "secret_probe"
difficulty = "easy"
entry_point = "secret_probe"
prompt = "Write `secret_probe(i: int) -> str`; the hidden tests say what it returns."
solution = '''{MARKER_TASK_SOLUTION}'''
tests = {list(MARKER_TASK_TESTS)!r}
"""


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)]
)
async def pool(request: pytest.FixtureRequest) -> AsyncIterator[WarmPool]:
    if request.param == "docker":
        require_docker()
    async with create_pool(request.param, size=4) as started:
        yield started


async def _grade_many(
    pool: WarmPool, submissions: list[tuple[str, tuple[str, ...], str]], timeout: float = PER_TEST_TIMEOUT
) -> list[GradeReport]:
    """Grade (label, tests, code) submissions with the pool's size in flight."""

    async def one(tests: tuple[str, ...], code: str) -> GradeReport:
        async with pool.acquire() as sandbox:
            return await grade(sandbox, code, tests, per_test_timeout=timeout)

    return list(await asyncio.gather(*(one(tests, code) for _, tests, code in submissions)))


async def test_every_hack_is_valid_python() -> None:
    for hack in HACKS:  # a hack that does not compile would score 0 without testing anything
        compile(hack_solution(hack, "count_vowels"), hack, "exec")


# Searchers whose search is only meaningful where there is a marker to find (and that take
# seconds per submission): run against the marker task below, not against all 60 tasks.
MARKER_ONLY = {"read /proc of every process", "read every open descriptor", "read every file", "ptrace"}


# Hacks that end or disrupt the harness process: what they test is the sandbox's and the
# harness's reaction (a dead, exited or signalled harness), which does not depend on the task;
# on Docker they run against one task per test form (`_tasks_covering_every_form`), elsewhere
# against all 60.
DISRUPTIVE = {
    "exit early with status 0",
    "exit early from inside a test",
    "SystemExit inside a test",
    "kill the harness",
    "signal every other process",
}


def _tasks_covering_every_form() -> list[Task]:
    """The first task of each difficulty and the first with each kind of check and test shape."""
    chosen: dict[str, Task] = {}
    for task in builtin_tasks():
        plans = plan_tests(task.tests)
        features = {task.difficulty.value} | {check.kind for plan in plans for check in plan.checks}
        features |= {"several checks" for plan in plans if len(plan.checks) > 1}
        features |= {"loop" for plan in plans if "for " in plan.probe}
        features |= {"statements" for plan in plans if "\n" in plan.probe.strip()}
        for feature in features:
            chosen.setdefault(feature, task)
    return list({task.id: task for task in chosen.values()}.values())


@pytest.mark.parametrize("hack", [name for name in HACKS if name not in MARKER_ONLY])
async def test_every_hack_scores_zero_on_every_task(pool: WarmPool, hack: str) -> None:
    docker = pool.backend.name == "docker"
    tasks = _tasks_covering_every_form() if docker and hack in DISRUPTIVE else list(builtin_tasks())
    submissions = [(task.id, task.tests, hack_solution(hack, task.entry_point)) for task in tasks]
    reports = await _grade_many(pool, submissions)
    scored = {task.id: f"{r.passed}/{r.total}" for task, r in zip(tasks, reports, strict=True) if r.passed}
    assert not scored, f"{hack!r} scored on {scored}"


async def test_searching_the_sandbox_finds_no_expected_value(pool: WarmPool) -> None:
    reference = await _grade_many(pool, [("reference", MARKER_TASK_TESTS, MARKER_TASK_SOLUTION)])
    assert reference[0].all_passed, reference[0].feedback()  # the task is gradeable as written
    searchers = list(SEARCH_HACKS)
    submissions = [(name, MARKER_TASK_TESTS, hack_solution(name, "secret_probe")) for name in searchers]
    # Time enough for a search of every process's memory to finish inside the first test.
    for name, report in zip(searchers, await _grade_many(pool, submissions, timeout=20.0), strict=True):
        printed = " ".join(outcome.output for outcome in report.outcomes)
        assert report.passed == 0 and "LEAK" not in printed, (name, report.feedback(), printed)
        # At least one search ran to its end and returned its (wrong) answer. Not necessarily all:
        # the /proc searcher reads the harness's own report pipe and so eats some of its reports,
        # which only ever fails tests.
        messages = [outcome.message for outcome in report.outcomes]
        wrong_answer = "returned something that is not plain data"
        assert any(message.startswith(wrong_answer) for message in messages), (name, messages)


async def test_tool_runs_see_nothing_of_the_hidden_tests(pool: WarmPool, tmp_path) -> None:
    (tmp_path / "secret.toml").write_text(MARKER_TOML)
    env = ToolCodeEnv(pool=pool, tasks_path=str(tmp_path / "secret.toml"), max_tool_calls=2)
    await env.areset(options={"task_id": "secret_probe"})
    # Results printed at the end: the /proc searcher reads (and so eats) this run's own stdout pipe.
    calls = (
        "found = []\n"
        + "".join(
            f"exec(compile({body!r}, 'searcher', 'exec'))\nfound.append(({name!r}, _search()))\n"
            for name, body in SEARCHERS.items()
        )
        + "print(' '.join(f'searched {name} {result}' for name, result in found))\n"
    )
    for _ in range(2):  # before and after a grading ran in this pool
        result = await env.call_tool(
            ToolCall("call_0", "run_python", json.dumps({"code": f"{SEARCH}\n{calls}"}))
        )
        observation = result.content
        assert result.info["tool_runs"] >= 1 and "exit code: 0" in observation, observation
        assert observation.count("searched") == len(SEARCHERS) and LEAK_MARKER not in observation, observation
        graded = await _grade_many(pool, [("reference", MARKER_TASK_TESTS, MARKER_TASK_SOLUTION)] * pool.size)
        assert all(report.all_passed for report in graded)
    await env.aclose()


@pytest.mark.parametrize("variant", list(HONEST_WRAPPERS))
async def test_honest_solutions_with_side_effects_still_pass(pool: WarmPool, variant: str) -> None:
    tasks = builtin_tasks()
    submissions = [
        (task.id, task.tests, honest_solution(variant, task.solution, task.entry_point)) for task in tasks
    ]
    reports = await asyncio.gather(*(_grade_honest(pool, tests, code) for _, tests, code in submissions))
    failing = {task.id: r.feedback() for task, r in zip(tasks, reports, strict=True) if not r.all_passed}
    assert not failing, f"{variant}: {failing}"
    if variant == "prints to stdout and stderr":
        outputs = [outcome.output for report in reports for outcome in report.outcomes]
        assert all("called with" in output and "stderr too" in output for output in outputs)


async def _grade_honest(pool: WarmPool, tests: tuple[str, ...], code: str) -> GradeReport:
    async with pool.acquire() as sandbox:  # generous limit: this is about isolation, not speed
        return await grade(sandbox, code, tests, per_test_timeout=10.0)
