"""Every reference solution passes all its tests and wrong solutions fail, on both backends.

The 60 tasks are graded concurrently through one small pool (as the env does), so a whole
backend takes a few seconds.
"""

from __future__ import annotations

import asyncio

import pytest
from agentrl_code.grading import GradeReport, grade
from agentrl_code.tasks import Task, builtin_tasks
from code_suite_helpers import off_by_one_solution, require_docker, stub_solution

from agentrl.sandbox import SandboxPool, create_pool


async def _grade_all(pool: SandboxPool, solutions: dict[str, str]) -> dict[str, GradeReport]:
    tasks = {task.id: task for task in builtin_tasks()}

    async def one(task: Task, code: str) -> GradeReport:
        async with pool.acquire() as sandbox:
            return await grade(sandbox, code, task.tests)

    reports = await asyncio.gather(*(one(tasks[task_id], code) for task_id, code in solutions.items()))
    return dict(zip(solutions, reports, strict=True))


async def _check_backend(backend: str) -> None:
    tasks = builtin_tasks()
    async with create_pool(backend=backend, size=4) as pool:
        references = await _grade_all(pool, {task.id: task.solution for task in tasks})
        failing = {tid: r.feedback() for tid, r in references.items() if not r.all_passed}
        assert not failing, f"reference solutions fail on {backend}: {failing}"

        stubs = await _grade_all(pool, {task.id: stub_solution(task) for task in tasks})
        passing = [tid for tid, r in stubs.items() if r.all_passed or r.fraction > 0.5]
        assert not passing, f"a `return None` stub scores over half on {backend}: {passing}"

        nudged = await _grade_all(pool, {task.id: off_by_one_solution(task) for task in tasks})
        passing = [tid for tid, r in nudged.items() if r.all_passed]
        assert not passing, f"an off-by-one variant passes every test on {backend}: {passing}"


async def test_reference_solutions_on_process_backend():
    await _check_backend("process")


@pytest.mark.docker
async def test_reference_solutions_on_docker_backend():
    require_docker()
    await _check_backend("docker")
