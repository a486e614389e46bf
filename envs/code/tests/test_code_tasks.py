"""The task set loads and validates; answers are read; tests split into probes and host checks."""

from __future__ import annotations

import collections
import json

import pytest
from agentrl_code.answers import extract_code, format_submission
from agentrl_code.grading import judge
from agentrl_code.probes import UnsupportedTestForm, plan_test, plan_tests
from agentrl_code.tasks import builtin_tasks, load_tasks
from agentrl_code.values import BadValue, decode, same

from agentrl.errors import ConfigError
from agentrl.sandbox.base import ExecResult

GOOD_TASK = """
[[task]]
id = "double"
difficulty = "easy"
entry_point = "double"
prompt = "Write `double(x: int) -> int` returning 2 * x. Example: double(2) == 4"
solution = "def double(x):\\n    return 2 * x\\n"
tests = ["assert double(1) == 2", "assert double(0) == 0", "assert double(-3) == -6",
         "assert double(10) == 20", "assert double(7) == 14"]
"""


def test_builtin_set_has_60_graded_tasks():
    tasks = builtin_tasks()
    counts = collections.Counter(task.difficulty.value for task in tasks)
    assert counts == {"easy": 20, "medium": 25, "hard": 15}
    assert len({task.id for task in tasks}) == len(tasks)
    assert all(5 <= len(task.tests) <= 10 for task in tasks)


def test_loader_reads_a_custom_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD_TASK)
    (task,) = load_tasks(path)
    assert task.id == "double" and len(task.tests) == 5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('difficulty = "easy"', 'difficulty = "trivial"'), "difficulty"),
        (("return 2 * x", "return 2 *"), "solution is not valid Python"),
        (('"assert double(7) == 14"', ""), "at least 5"),
        (('entry_point = "double"', 'entry_point = "triple"'), "does not define"),
        (('id = "double"', 'id = "double"\ncolour = "red"'), "colour"),
    ],
)
def test_loader_names_what_is_wrong(tmp_path, change, message):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD_TASK.replace(*change).replace(", ]", "]").replace(",\n         ]", "]"))
    with pytest.raises(ConfigError, match=message):
        load_tasks(path)


def test_duplicate_ids_are_rejected(tmp_path):
    (tmp_path / "a.toml").write_text(GOOD_TASK)
    (tmp_path / "b.toml").write_text(GOOD_TASK)
    with pytest.raises(ConfigError, match="duplicate task id 'double'"):
        load_tasks(tmp_path)


def test_extract_code_prefers_answer_then_last_fence():
    assert extract_code("text\n```python\na = 1\n```\nmore\n```\nb = 2\n```") == "b = 2\n"
    assert extract_code("<answer>x = 3</answer>") == "x = 3\n"
    assert extract_code("<answer>\n```py\ny = 4\n```\n</answer>```python\nz\n```") == "y = 4\n"
    assert extract_code("no code here") is None
    assert extract_code("```python\n\n```") is None
    assert extract_code(format_submission("def f():\n    return 1")) == "def f():\n    return 1\n"


def _events(*events: dict) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def _observed(test: int, check: int, **outcome: object) -> dict:
    return {"event": "observed", "test": test, "check": check, "outcome": outcome}


def _end(test: int, passed_run: bool = True, message: str = "", output: str = "") -> dict:
    return {"event": "test_end", "test": test, "passed_run": passed_run, "message": message, "output": output}


def test_probes_carry_no_expected_value_and_hide_which_calls_must_raise():
    (plan,) = plan_tests(("data = [9, 1, 5]\nassert median(data) == 5.25\nassert data == [9, 1, 5]",))
    assert "5.25" not in plan.probe and "==" not in plan.probe
    assert [(c.kind, c.expected) for c in plan.checks] == [("equal", 5.25), ("equal", [9, 1, 5])]
    raising, returning = plan_tests(("assert raises(ValueError, f, 'x')", "assert f('y') == 'Y'"))
    assert raising.probe == "_observe(0, lambda: f('x'))" and returning.probe == "_observe(0, lambda: f('y'))"
    assert "ValueError" not in raising.probe and raising.checks[0].expected == "ValueError"


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("x = [1]\nassert f(x) == x", "uses \\['x'\\]"),  # expected value needs the sandbox's variables
        ("assert f(1) != 2", "unsupported assert"),
        ("assert f(1) is 3", "unsupported assert"),
        ("assert raises(MyError, f, 1)", "raises\\(BuiltinError"),
        ("ok = raises(ValueError, f, 1)\nassert ok == True", "may only appear"),
        ("f(1)", "at least one assert"),
        ("assert f(1) == 1 / 0", "ZeroDivisionError"),
    ],
)
def test_tests_the_host_cannot_judge_are_rejected(test, message):
    with pytest.raises(UnsupportedTestForm, match=message):
        plan_test(test)


def test_values_decode_to_plain_data_only():
    encoded = [1, 2.5, "s", None, True, {"tuple": [1, {"set": [2]}]}, {"dict": [["k", {"bytes": "ff"}]]}]
    assert decode(encoded) == [1, 2.5, "s", None, True, (1, {2}), {"k": b"\xff"}]
    for bad in ({"object": []}, {"tuple": 1}, {"set": [[1]]}, {"dict": [[1]]}, {"tuple": [], "set": []}):
        with pytest.raises(BadValue):
            decode(bad)
    deep: object = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(BadValue, match="deeply"):
        decode(deep)
    assert same((1, 2.0), (1, 2.0)) and not same(True, 1) and not same([1], (1,)) and same(0.1 + 0.2, 0.3)


def test_judge_trusts_values_not_claims():
    plans = plan_tests(
        ("assert f(1) == 3", "assert raises(ValueError, f, -1)", "x = [1]\nf(x)\nassert x == [1]")
    )
    stdout = "garbage line\n" + _events(
        {"event": "loaded"},
        _observed(0, 0, value=3),
        _end(0, output="hi"),
        _observed(1, 0, raised=["ValueError", "Exception", "BaseException"], message="ValueError: no"),
        _end(1),
        _end(2),  # claims the run of test 2 passed but never reported its check
    )
    report = judge(ExecResult(0, stdout, "", 0.1), plans)
    assert [o.passed for o in report.outcomes] == [True, True, False]
    assert report.outcomes[0].output == "hi" and "never reached" in report.outcomes[2].message

    forged = _events(
        {"event": "loaded"},
        _observed(0, 0, value=3),
        _observed(0, 0, value=4),  # any wrong observation fails the check
        _end(0),
        _observed(1, 0, value={"__eq__": True}),
        _end(1),
        _observed(2, 0, raised=["ValueError"], message="forged"),
        _end(2),
    )
    report = judge(ExecResult(0, forged, "", 0.1), plans)
    assert report.passed == 0
    assert (
        report.outcomes[0].message == "got 4, expected 3" and report.outcomes[1].message == "malformed result"
    )


def test_judge_fails_closed_on_missing_reports():
    plans = plan_tests(("assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"))
    stdout = _events({"event": "loaded"}, _observed(0, 0, value=2), _end(0))
    report = judge(ExecResult(-9, stdout, "Killed", 0.5), plans)
    assert report.outcomes[0].message == "got 2, expected 1"
    assert "crashed while running this test" in report.outcomes[1].message
    assert report.outcomes[2].message.startswith("not run") and report.passed == 0
    timed_out = judge(ExecResult(None, stdout, "", 9.0, timed_out=True), plans)
    assert timed_out.outcomes[1].message.startswith("timed out") and timed_out.timed_out


def test_report_of_code_that_does_not_load():
    plans = plan_tests(("assert f(1) == 1", "assert f(2) == 2"))
    stdout = _events({"event": "load_error", "message": "SyntaxError: invalid syntax"})
    report = judge(ExecResult(0, stdout, "", 0.1), plans)
    assert report.load_error == "SyntaxError: invalid syntax"
    assert "failed before any test ran" in report.feedback()
