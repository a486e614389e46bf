"""The task set loads and validates; answers and harness reports are read correctly."""

from __future__ import annotations

import collections

import pytest
from agentrl_code.answers import extract_code, extract_tool_call, format_submission
from agentrl_code.grading import parse_report
from agentrl_code.tasks import builtin_tasks, load_tasks

from agentrl.errors import ConfigError
from agentrl.sandbox.base import ExecResult

GOOD_TASK = '''
[[task]]
id = "double"
difficulty = "easy"
entry_point = "double"
prompt = "Write `double(x: int) -> int` returning 2 * x. Example: double(2) == 4"
solution = "def double(x):\\n    return 2 * x\\n"
tests = ["assert double(1) == 2", "assert double(0) == 0", "assert double(-3) == -6",
         "assert double(10) == 20", "assert double(7) == 14"]
'''


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
        (("difficulty = \"easy\"", "difficulty = \"trivial\""), "difficulty"),
        (("return 2 * x", "return 2 *"), "solution is not valid Python"),
        (("\"assert double(7) == 14\"", ""), "at least 5"),
        (("entry_point = \"double\"", "entry_point = \"triple\""), "does not define"),
        (("id = \"double\"", "id = \"double\"\ncolour = \"red\""), "colour"),
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


def test_extract_tool_call():
    assert extract_tool_call("let me try <python>print(1)</python>") == "print(1)\n"
    assert extract_tool_call("```python\nprint(1)\n```") is None


def _line(nonce, *fields):
    return " ".join((nonce, *fields)) + "\n"


def _hex(text):
    return text.encode().hex()


def test_report_ignores_lines_without_the_nonce():
    tests = ["assert f() == 1", "assert f() == 2"]
    stdout = (
        _line("fake", "test", "1", "1", "", "")
        + _line("n0nce", "loaded")
        + _line("n0nce", "test", "0", "1", "", _hex("hello"))
        + "n0nc3 test 1 1  \n"
    )
    report = parse_report(ExecResult(None, stdout, "", 1.0, timed_out=True), "n0nce", tests)
    assert [o.passed for o in report.outcomes] == [True, False]
    assert report.outcomes[0].output == "hello"
    assert report.outcomes[1].message.startswith("timed out")
    assert report.fraction == 0.5


def test_report_marks_tests_after_a_crash_as_not_run():
    tests = ["assert f(1)", "assert f(2)", "assert f(3)"]
    stdout = _line("k", "loaded") + _line("k", "test", "0", "0", _hex("got 1, expected 2"), "")
    report = parse_report(ExecResult(-9, stdout, "Killed", 0.5), "k", tests)
    assert report.outcomes[0].message == "got 1, expected 2"
    assert "crashed while running this test" in report.outcomes[1].message
    assert report.outcomes[2].message.startswith("not run")
    assert report.passed == 0


def test_report_of_code_that_does_not_load():
    tests = ["assert f(1)"] * 2
    stdout = _line("k", "load_error", _hex("SyntaxError: invalid syntax"))
    report = parse_report(ExecResult(0, stdout, "", 0.1), "k", tests)
    assert report.load_error == "SyntaxError: invalid syntax"
    assert "failed before any test ran" in report.feedback()
