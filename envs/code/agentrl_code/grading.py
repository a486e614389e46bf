"""Grade candidate code against hidden tests in a sandbox, and turn the result into feedback.

`grade()` sends `harness.py` and a JSON payload (candidate code, tests, a fresh nonce) to a
sandbox, runs it once, and `parse_report()` reads back the per-test events. Reading is strict:
only lines carrying this run's nonce count, and a test with no event is failed (timed out if
the sandbox hit its time limit, otherwise crashed or not run), so a candidate cannot gain a
pass by printing, exiting early or killing the harness.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from importlib import resources

from agentrl.sandbox.base import ExecResult, Sandbox

HARNESS_SOURCE = (resources.files("agentrl_code") / "harness.py").read_text(encoding="utf-8")
HARNESS_FILE = "harness.py"


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


def build_payload(code: str, tests: list[str] | tuple[str, ...], nonce: str, per_test_timeout: float) -> str:
    return json.dumps(
        {"nonce": nonce, "code": code, "tests": list(tests), "per_test_timeout": per_test_timeout}
    )


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
    """Run `code` against `tests` in `sandbox`; one process, each test isolated by try/except."""
    nonce = secrets.token_hex(16)
    result = await sandbox.run(
        [python, HARNESS_FILE],
        stdin=build_payload(code, tests, nonce, per_test_timeout),
        files={HARNESS_FILE: HARNESS_SOURCE},
        timeout=time_budget(len(tests), per_test_timeout),
    )
    return parse_report(result, nonce, tests)


def parse_report(result: ExecResult, nonce: str, tests: list[str] | tuple[str, ...]) -> GradeReport:
    """Read the harness's events for `nonce` out of `result` (see harness.py for the protocol)."""
    loaded = False
    load_error: str | None = None
    reported: dict[int, TestOutcome] = {}
    for fields in _events(result.stdout, nonce):
        kind = fields[0]
        if kind == "loaded":
            loaded = True
        elif kind == "load_error" and len(fields) == 2:
            load_error = _unhex(fields[1])
        elif kind == "test" and len(fields) == 5 and fields[1].isdigit():
            index = int(fields[1])
            if index < len(tests):
                passed = fields[2] == "1"
                reported[index] = TestOutcome(
                    index, tests[index], passed, _unhex(fields[3]), _unhex(fields[4])
                )
    if load_error is not None:
        message = f"could not load: {load_error}"
        failed = [TestOutcome(i, source, False, message) for i, source in enumerate(tests)]
        return GradeReport(failed, load_error=load_error, exec_result=result)
    missing_reason = _missing_reason(result, loaded=loaded)
    outcomes: list[TestOutcome] = []
    first_missing = True
    for index, source in enumerate(tests):
        outcome = reported.get(index)
        if outcome is None:  # the harness died during this test (the first missing one) or before it
            reason = missing_reason if first_missing else "not run (the test run ended earlier)"
            outcome = TestOutcome(index, source, False, reason)
            first_missing = False
        outcomes.append(outcome)
    no_test_ran = not loaded and not reported
    return GradeReport(outcomes, load_error=missing_reason if no_test_ran else None, exec_result=result)


def _events(stdout: str, nonce: str) -> list[list[str]]:
    """The space-separated fields that follow `nonce` on each line of `stdout`; others are ignored."""
    marker = nonce + " "
    events = []
    for line in stdout.splitlines():
        position = line.find(marker)
        if position >= 0:
            fields = line[position + len(marker) :].split(" ")
            if fields and fields[0]:
                events.append(fields)
    return events


def _unhex(text: str) -> str:
    try:
        return bytes.fromhex(text).decode("utf-8", "replace")
    except ValueError:
        return ""


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
