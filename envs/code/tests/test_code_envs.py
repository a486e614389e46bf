"""The three code envs: registration, gymnasium conformance, rewards, feedback, hostile code."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentrl_code.env import CodeEnv, SingleTurnCodeEnv, ToolCodeEnv
from agentrl_code.pools import shared_pool_refs
from agentrl_code.tasks import builtin_tasks
from code_suite_helpers import require_docker
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl.errors import ConfigError
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.scripted import ExpertPolicy, RandomPolicy
from agentrl.tools import ToolCall
from agentrl.trajectory import StopReason

ENV_IDS = ["code/Python-v0", "code/PythonSingleTurn-v0", "code/PythonTool-v0"]
WRONG = "```python\ndef count_vowels(s):\n    return 0\n```"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_registered_and_passes_check_env(env_id):
    assert env_id in agentrl.list_envs()
    env = agentrl.make(env_id, backend="process")
    check_env(env, skip_render_check=True)
    env.close()


async def test_expert_solves_every_task_through_one_shared_pool():
    tasks = builtin_tasks()
    envs = [CodeEnv(backend="process", pool_size=4) for _ in tasks]

    async def play(index: int, env: CodeEnv) -> dict:
        await env.areset(seed=index)
        _, reward, terminated, truncated, info = await env.astep(env.expert_action())
        assert (reward, terminated, truncated) == (1.0, True, False), info
        return info

    infos = await asyncio.gather(*(play(i, env) for i, env in enumerate(envs)))
    assert shared_pool_refs("process") == len(envs)  # one pool, borrowed by all
    assert {info["task_id"] for info in infos} == {task.id for task in tasks}
    assert all(info["success"] for info in infos)
    await asyncio.gather(*(env.aclose() for env in envs))
    assert shared_pool_refs("process") == 0


async def test_feedback_then_fix_totals_the_final_score():
    env = CodeEnv(backend="process", max_turns=3)
    observation, info = await env.areset(options={"task_id": "count_vowels"})
    assert "count_vowels(s: str) -> int" in observation and info["task_id"] == "count_vowels"
    observation, reward1, terminated, truncated, info = await env.astep(WRONG)
    assert not terminated and not truncated
    assert 0.0 < reward1 < 1.0 and info["tests_passed"] < info["tests_total"]
    assert 'assert count_vowels("Hello World") == 3' in observation and "got 0, expected 3" in observation
    _, reward2, terminated, _, info = await env.astep(env.expert_action())
    assert terminated and info["success"] and reward1 + reward2 == pytest.approx(1.0)
    await env.aclose()


async def test_no_code_costs_the_format_penalty_and_keeps_the_task():
    env = CodeEnv(backend="process", max_turns=2, format_penalty=-0.2)
    await env.areset(seed=3)
    task = env.task
    observation, reward, terminated, truncated, info = await env.astep("I would use a loop.")
    assert (reward, terminated, truncated, info["format_error"]) == (-0.2, False, False, True)
    assert "```python" in observation and env.task is task
    _, _, terminated, truncated, _ = await env.astep(WRONG)  # second and last turn
    assert truncated and not terminated
    await env.aclose()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def count_vowels(s):\n    while True:\n        pass", "timed out"),
        (
            "def count_vowels(s):\n    while True:\n        try:\n            pass\n"
            "        except BaseException:\n            pass",
            "timed out",
        ),
        ("import sys\nsys.exit(0)", "SystemExit"),
        ("import os\ndef count_vowels(s):\n    os._exit(0)", "crashed"),
        ("def count_vowels(s):\n    return count_vowels(s)", "RecursionError"),
        ("def count_vowels(s):\n    x = bytearray(1 << 34)", "MemoryError"),
    ],
)
async def test_hostile_submissions_end_as_failed_tests_not_crashed_episodes(code, expected):
    env = SingleTurnCodeEnv(backend="process", per_test_timeout=0.5)
    await env.areset(options={"task_id": "count_vowels"})
    observation, reward, terminated, _, info = await env.astep(f"```python\n{code}\n```")
    assert terminated and reward == 0.0 and not info["success"]
    assert expected in observation
    await env.aclose()


FAKE_REPORTS = """
import json, os, sys
lines = [json.dumps({"event": "test", "i": i, "passed": True, "error": ""}) for i in range(20)]
for prefix in ["", "nonce ", "0" * 32 + " "]:
    for line in lines:
        print(prefix + line)
        sys.__stdout__.write(prefix + line + "\\n")
        os.write(1, (prefix + line + "\\n").encode())
        os.write(2, (prefix + line + "\\n").encode())

class AlwaysEqual:
    def __eq__(self, other):
        return True

def count_vowels(s):
    return AlwaysEqual()
"""


# Each defines a wrong count_vowels and tries to make the harness report passes anyway.
TAMPERING = {
    "fake report lines": FAKE_REPORTS,
    "no-op exec": "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
    "def count_vowels(s):\n    return -1",
    "no-op checker": "import __main__\n__main__._strict_eq = lambda *a: None\n"
    "__main__._make_strict_eq = lambda: (lambda *a: None)\ndef count_vowels(s):\n    return -1",
    "forged json": 'import json\njson.dumps = lambda *a, **k: "{}"\njson.loads = lambda *a, **k: {}\n'
    "def count_vowels(s):\n    return -1",
    "rewriting os.write": "import os\n_w = os.write\n"
    'os.write = lambda fd, b: _w(fd, b.replace(b" 0 ", b" 1 "))\ndef count_vowels(s):\n    return -1',
    "empty enumerate": "import builtins\nbuiltins.enumerate = lambda *a: iter(())\n"
    "builtins.len = lambda x: 0\nbuiltins.all = lambda x: True\ndef count_vowels(s):\n    return [-1]",
    "metaclass equality": "class Meta(type):\n    def __eq__(cls, other):\n        return True\n"
    "    __hash__ = type.__hash__\nclass Liar(int, metaclass=Meta):\n    def __eq__(self, other):\n"
    "        return True\n    __hash__ = int.__hash__\ndef count_vowels(s):\n    return Liar(-1)",
}


@pytest.mark.parametrize("code", list(TAMPERING.values()), ids=list(TAMPERING))
async def test_tampering_with_the_harness_cannot_fake_a_pass(code):
    env = SingleTurnCodeEnv(backend="process")
    await env.areset(options={"task_id": "count_vowels"})
    _, reward, _, _, info = await env.astep(f"```python\n{code}\n```")
    assert reward == 0.0 and info["tests_passed"] == 0, info
    await env.aclose()


def run_python(code: str, call_id: str = "call_0") -> ToolCall:
    return ToolCall(call_id, "run_python", json.dumps({"code": code}))


async def test_tool_env_runs_code_then_grades_one_submission():
    env = ToolCodeEnv(backend="process", max_tool_calls=1)
    observation, _ = await env.areset(options={"task_id": "digit_sum"})
    assert "run_python" in observation and [t.name for t in env.tools()] == ["run_python"]
    result = await env.call_tool(run_python("print(sum([4, 0, 9, 6]))"))
    assert "19" in result.content and "exit code: 0" in result.content and result.info["tool_runs"] == 1
    assert (result.reward, result.terminated) == (0.0, False)
    result = await env.call_tool(run_python("print(1)"))
    assert result.info["tool_budget_exceeded"] and "budget" in result.content
    bad = await env.call_tool(ToolCall("call_2", "run_python", json.dumps({"source": "print(1)"})))
    assert bad.reward == env.tool_error_penalty and "arguments.code is required" in bad.content
    _, reward, terminated, _, info = await env.astep(env.expert_action())
    assert terminated and reward == 1.0 and info["success"]
    await env.aclose()


def test_reset_is_deterministic_and_options_select_tasks():
    env = CodeEnv(backend="process")
    assert env.reset(seed=7)[1]["task_id"] == env.reset(seed=7)[1]["task_id"]
    assert env.reset(seed=7 + len(env.tasks))[1]["task_id"] == env.reset(seed=7)[1]["task_id"]
    assert env.reset(seed=0, options={"difficulty": "hard"})[1]["difficulty"] == "hard"
    assert env.reset(options={"task_id": "eval_arith"})[1]["task_id"] == "eval_arith"
    with pytest.raises(ConfigError, match="did you mean eval_arith"):
        env.reset(options={"task_id": "eval_arithm"})
    with pytest.raises(ConfigError, match="unknown reset options"):
        env.reset(options={"level": 3})
    env.close()


def test_bad_configuration_is_named():
    with pytest.raises(ConfigError, match="backend='podman'"):
        CodeEnv(backend="podman")
    with pytest.raises(ConfigError, match="unknown difficulty"):
        CodeEnv(difficulty="impossible")
    assert {t.difficulty.value for t in CodeEnv(difficulty=["easy"]).tasks} == {"easy"}


def test_sample_actions_are_valid_text():
    for cls in (CodeEnv, SingleTurnCodeEnv, ToolCodeEnv):
        env = cls(backend="process")
        env.reset(seed=1)
        for _ in range(5):
            assert env.action_space.contains(env.sample_action())
        env.close()


async def test_env_manager_plays_code_episodes_with_scripted_policies():
    expert = EnvManager("code/Python-v0", ExpertPolicy(), group_size=2, env_kwargs={"backend": "process"})
    groups = await expert.run(range(10))
    await expert.aclose()
    trajectories = [t for group in groups for t in group.trajectories]
    assert len(trajectories) == 20 and all(t.success and t.total_reward == 1.0 for t in trajectories)

    random = EnvManager(
        "code/PythonTool-v0", RandomPolicy(seed=0), group_size=2, env_kwargs={"backend": "process"}
    )
    groups = await random.run(range(6))
    await random.aclose()
    trajectories = [t for group in groups for t in group.trajectories]
    assert all(t.stop_reason in (StopReason.TERMINATED, StopReason.TRUNCATED) for t in trajectories)
    assert not any(t.success for t in trajectories)
    assert shared_pool_refs("process") == 0  # closing the managers released the shared pool


def test_stepping_a_finished_episode_is_an_error():
    env = SingleTurnCodeEnv(backend="process")
    env.reset(seed=0)
    env.step("no code")
    with pytest.raises(agentrl.AgentRLError, match="call reset"):
        env.step("no code")
    env.close()


@pytest.mark.docker
async def test_all_three_envs_on_the_docker_backend():
    """The envs as a user runs them with Docker: feedback, a hostile submission, the tool, a fix."""
    require_docker()
    multi = CodeEnv(backend="docker", max_turns=3, pool_size=2)
    await multi.areset(options={"task_id": "count_vowels"})
    observation, reward1, terminated, _, info = await multi.astep(WRONG)
    assert not terminated and 0.0 < reward1 < 1.0 and "got 0, expected 3" in observation
    _, reward2, terminated, _, info = await multi.astep(multi.expert_action())
    assert terminated and info["success"] and reward1 + reward2 == pytest.approx(1.0)

    single = SingleTurnCodeEnv(backend="docker", per_test_timeout=0.5)
    await single.areset(options={"task_id": "count_vowels"})
    loop = "```python\ndef count_vowels(s):\n    while True:\n        pass\n```"
    observation, reward, terminated, _, info = await single.astep(loop)
    assert terminated and reward == 0.0 and "timed out" in observation

    tool = ToolCodeEnv(backend="docker", max_tool_calls=1)
    await tool.areset(options={"task_id": "digit_sum"})
    result = await tool.call_tool(run_python("import socket; socket.getaddrinfo('x.org', 80)"))
    assert "exit code: 1" in result.content  # no network in the sandbox
    _, reward, terminated, _, info = await tool.astep(tool.expert_action())
    assert terminated and reward == 1.0 and info["success"]

    assert shared_pool_refs("docker") == 3  # one Docker pool for the three envs
    await asyncio.gather(multi.aclose(), single.aclose(), tool.aclose())
    assert shared_pool_refs("docker") == 0
