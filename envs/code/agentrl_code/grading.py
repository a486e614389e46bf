"""Grade candidate code against hidden tests: computed in a sandbox, judged on the host.

`grade()` sends the candidate's code, `harness.py` and the tests' *probes* (the tests with every
expected value taken out, see `probes.py`) to one sandbox run. The sandbox reports, as plain
data, what each asserted expression evaluated to; `judge()` decodes those values (`values.py`)
and compares them here, on the host, with expected values the sandbox never saw. So a pass can
only be had by producing the right values: printing fake results, patching the harness, walking
its frames or exiting early can change what is reported, never what it is compared with. A test
with no complete report fails (timed out if the sandbox hit its time limit, otherwise crashed or
not run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from agentrl.sandbox.base import ExecResult, Sandbox
from agentrl_code.probes import Check, SplitTest, plan_tests
from agentrl_code.values import BadValue, decode, same, short

HARNESS_SOURCE = (resources.files("agentrl_code") / "harness.py").read_text(encoding="utf-8")
HARNESS_FILE = "harness.py"
SOLUTION_FILE = "solution.py"
MAX_REPORT_BYTES = 8 << 20


@dataclass(frozen=True)
class TestOutcome:
    """The result of one hidden test."""

    index: int
    source: str
    passed: bool
    message: str = ""  # why it failed: an assertion's got/expected, an exception, "timed out"
    output: str = ""  # what the candidate printed during the test (truncated)


@dataclass
class GradeReport:
    """All tests of one submission, plus what went wrong before any test ran."""

    outcomes: list[TestOutcome]
    load_error: str | None = None
    exec_result: ExecResult | None = field(default=None, repr=False)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return sum(outcome.passed for outcome in self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def timed_out(self) -> bool:
        return any(outcome.message.startswith("timed out") for outcome in self.outcomes)

    def feedback(self, max_failures: int = 5) -> str:
        """A short text for the agent: the score and the first few failures with their tests."""
        lines = [f"Passed {self.passed}/{self.total} tests."]
        if self.load_error:
            lines.append(f"Your code failed before any test ran: {self.load_error}")
            return "\n".join(lines)
        failures = [outcome for outcome in self.outcomes if not outcome.passed]
        for outcome in failures[:max_failures]:
            lines.append(f"- Test: {outcome.source.strip()}\n  Failed: {outcome.message}")
            if outcome.output:
                lines.append(f"  Printed: {outcome.output[:200]!r}")
        if len(failures) > max_failures:
            lines.append(f"... and {len(failures) - max_failures} more failing tests.")
        return "\n".join(lines)


def build_payload(plans: tuple[SplitTest, ...], per_test_timeout: float) -> str:
    """The harness's stdin: probes and the time limit, nothing the host judges with."""
    return json.dumps({"probes": [plan.probe for plan in plans], "per_test_timeout": per_test_timeout})


def time_budget(num_tests: int, per_test_timeout: float) -> float:
    """The sandbox's wall-clock limit: every test at its limit, plus interpreter start-up."""
    return per_test_timeout * (num_tests + 1) + 2.0


async def grade(
    sandbox: Sandbox,
    code: str,
    tests: list[str] | tuple[str, ...],
    *,
    per_test_timeout: float = 2.0,
    python: str = "python3",
) -> GradeReport:
    """Run `code` against `tests`: one sandbox run computes, the host judges."""
    plans = plan_tests(tuple(tests))
    result = await sandbox.run(
        [python, HARNESS_FILE],
        stdin=build_payload(plans, per_test_timeout),
        files={HARNESS_FILE: HARNESS_SOURCE, SOLUTION_FILE: code},
        timeout=time_budget(len(plans), per_test_timeout),
        max_output_bytes=MAX_REPORT_BYTES,
    )
    return judge(result, plans)


@dataclass
class _TestEvents:
    ended: bool = False
    passed_run: bool = False
    message: str = ""
    output: str = ""
    observed: dict[int, list[dict]] = field(default_factory=dict)


def judge(result: ExecResult, plans: tuple[SplitTest, ...]) -> GradeReport:
    """Decide every test from the sandbox's events (see harness.py) and the host-only checks."""
    loaded = False
    load_error: str | None = None
    events = {index: _TestEvents() for index in range(len(plans))}
    for event in _events(result.stdout):
        kind = event.get("event")
        test = events.get(event.get("test")) if type(event.get("test")) is int else None
        if kind == "loaded":
            loaded = True
        elif kind == "load_error":
            load_error = _text(event.get("message")) or "failed"
        elif kind == "observed" and test is not None and type(event.get("check")) is int:
            outcome = event.get("outcome")
            if type(outcome) is dict:
                test.observed.setdefault(event["check"], []).append(outcome)
        elif kind == "test_end" and test is not None and not test.ended:
            test.ended = True
            test.passed_run = event.get("passed_run") is True
            test.message = _text(event.get("message"))
            test.output = _text(event.get("output"))
    if load_error is not None:
        message = f"could not load: {load_error}"
        failed = [TestOutcome(i, plan.source, False, message) for i, plan in enumerate(plans)]
        return GradeReport(failed, load_error=load_error, exec_result=result)
    missing_reason = _missing_reason(result, loaded=loaded)
    outcomes: list[TestOutcome] = []
    first_missing = True
    for index, plan in enumerate(plans):
        test = events[index]
        if not test.ended:  # the harness died during this test (the first missing one) or before it
            reason = missing_reason if first_missing else "not run (the test run ended earlier)"
            outcomes.append(TestOutcome(index, plan.source, False, reason))
            first_missing = False
            continue
        message = test.message if not test.passed_run else _first_failure(plan, test.observed)
        outcomes.append(TestOutcome(index, plan.source, message == "", message, test.output))
    no_test_ran = not loaded and all(not test.ended for test in events.values())
    return GradeReport(outcomes, load_error=missing_reason if no_test_ran else None, exec_result=result)


def _first_failure(plan: SplitTest, observed: dict[int, list[dict]]) -> str:
    """Why the test failed ("" when every check was observed and every observation passed)."""
    for index, check in enumerate(plan.checks):
        outcomes = observed.get(index)
        if not outcomes:
            return f"never reached `{check.source}`"
        for outcome in outcomes:
            failure = _check_failure(check, outcome)
            if failure:
                return failure
    return ""


def _check_failure(check: Check, outcome: dict) -> str:
    if outcome.get("too_many") is True:
        return f"`{check.source}` gave too many different results"
    if "unencodable" in outcome:
        return f"returned something that is not plain data ({_text(outcome['unencodable'])[:100]})"
    if "raised" in outcome:
        classes = outcome["raised"]
        if check.kind == "raises" and type(classes) is list and check.expected in classes:
            return ""
        return _text(outcome.get("message")) or "raised an exception"
    if "value" not in outcome:
        return "malformed result"
    try:
        value = decode(outcome["value"])
    except (BadValue, RecursionError):
        return "malformed result"
    if check.kind == "raises":
        return f"expected {check.expected} to be raised, got {short(value)}"
    if check.kind == "is":
        return "" if value is check.expected else f"got {short(value)}, expected {check.expected!r}"
    return "" if same(value, check.expected) else f"got {short(value)}, expected {short(check.expected)}"


def _events(stdout: str) -> list[dict]:
    """The JSON objects on each line of `stdout`; anything else is ignored."""
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(event) is dict:
            events.append(event)
    return events


def _text(value: object) -> str:
    return value if type(value) is str else ""


def _missing_reason(result: ExecResult, *, loaded: bool) -> str:
    if result.timed_out:
        return "timed out (the whole test run hit its time limit)"
    if result.memory_exceeded:
        return "memory limit exceeded"
    if result.sandbox_error:
        return f"the sandbox failed: {result.sandbox_error[:200]}"
    stage = "while running this test" if loaded else "while loading your code"
    detail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    suffix = f": {detail[0][:200]}" if detail else ""
    return f"crashed {stage} (exit code {result.exit_code}){suffix}"
