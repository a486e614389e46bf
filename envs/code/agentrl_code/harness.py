"""The test harness that runs INSIDE the sandbox: load candidate code, run each hidden test.

This file is copied into the sandbox and run as `python3 harness.py`; it uses only the standard
library. Its input arrives on stdin as one JSON object (so that the hidden tests never sit in a
file the candidate code could open):

    {"nonce": "...", "code": "<candidate source>", "tests": ["assert f(1) == 2", ...],
     "per_test_timeout": 2.0}

It reports by writing lines `<nonce> <json>` to a private duplicate of the original stdout, one
per event, flushed as it goes, so that a run killed half-way still tells which tests finished:

    {"event": "loaded"}                       the candidate code executed without error
    {"event": "load_error", "error": "..."}   it did not (syntax error, exception at import)
    {"event": "test", "i": 0, "passed": true, "error": "", "output": ""}
    {"event": "done"}

Why the precautions: the candidate is untrusted and runs in this same interpreter.
- The nonce is random per run and only ever on stdin, so printing a fake report line cannot
  match it; everything the candidate writes (print, sys.__stdout__, fd 1 or fd 2) is captured
  or sent to /dev/null, never to the report channel.
- `assert actual == expected` in a test is checked by `_strict_eq`, which compares types as well
  as values, so an object whose `__eq__` always returns True does not pass.
- Each test runs under a SIGALRM timer; a test that loops is reported as timed out. A loop that
  swallows the timer's exception or blocks in C is ended by the sandbox's own timeout, and the
  host side marks the test that was running as timed out.
- `SystemExit` and every other `BaseException` from a test count as that test's failure.
"""

import ast
import io
import json
import math
import os
import signal
import sys
import traceback

MAX_MESSAGE = 300
MAX_OUTPUT = 2000


class TestTimeout(BaseException):
    """Raised by the SIGALRM handler inside a test that ran past its time."""


class _CappedWriter(io.TextIOBase):
    """A text stream that keeps the first MAX_OUTPUT characters and drops the rest."""

    def __init__(self):
        self.parts = []
        self.size = 0

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        if self.size < MAX_OUTPUT:
            self.parts.append(text[: MAX_OUTPUT - self.size])
        self.size += len(text)
        return len(text)

    def value(self):
        return "".join(self.parts)


def _short(value):
    try:
        text = repr(value)
    except BaseException as exc:  # a hostile __repr__ must not break the report
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    return text if len(text) <= 120 else text[:117] + "..."


def _same(actual, expected):
    """Equality that also requires matching types (numbers may mix int and float)."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if type(expected) is float or type(actual) is float:
            return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
        return type(actual) is int and type(expected) is int and actual == expected
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            return False
        return all(_same(a, e) for a, e in zip(actual, expected, strict=True))
    if isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_same(actual[k], expected[k]) for k in expected)
    if isinstance(expected, (str, bytes, type(None), set, frozenset)):
        return actual == expected
    return bool(expected == actual)


def _strict_eq(actual, expected):
    if not _same(actual, expected):
        raise AssertionError(f"got {_short(actual)}, expected {_short(expected)}")


def raises(exc_type, func, *args, **kwargs):
    """True when `func(*args, **kwargs)` raises `exc_type` (tests use it for error cases)."""
    try:
        func(*args, **kwargs)
    except exc_type:
        return True
    except Exception:
        return False
    return False


class _StrictAsserts(ast.NodeTransformer):
    """Rewrite `assert A == B` into a call of `_strict_eq(A, B)` with a helpful message."""

    def visit_Assert(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            call = ast.Call(ast.Name("_strict_eq", ast.Load()), [test.left, test.comparators[0]], [])
            return ast.copy_location(ast.Expr(call), node)
        return node


def _compile_test(source, index):
    tree = ast.fix_missing_locations(_StrictAsserts().visit(ast.parse(source)))
    return compile(tree, f"<test {index}>", "exec")


def _error_message(exc):
    try:
        return _describe(exc)
    except BaseException:  # a hostile exception whose __str__ raises or loops
        return f"{type(exc).__name__} (message unavailable)"


def _describe(exc):
    if isinstance(exc, TestTimeout):
        return "timed out"
    if isinstance(exc, AssertionError):
        text = str(exc) or "assertion failed"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(frames) if f.filename == "solution.py"), "")
        text = f"{type(exc).__name__}: {exc}" + (f" (solution.py {where})" if where else "")
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _on_alarm(signum, frame):
    raise TestTimeout()


def main():
    spec = json.loads(sys.stdin.read())
    nonce = spec["nonce"]
    report_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def report(event):
        os.write(report_fd, (nonce + " " + json.dumps(event) + "\n").encode())

    signal.signal(signal.SIGALRM, _on_alarm)
    timeout = float(spec["per_test_timeout"])
    namespace = {"__name__": "solution", "raises": raises}
    sys.stdout = sys.stderr = _CappedWriter()
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        exec(compile(spec["code"], "solution.py", "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report({"event": "load_error", "error": _error_message(exc)})
        os._exit(0)
    report({"event": "loaded"})
    for index, source in enumerate(spec["tests"]):
        sys.stdout = sys.stderr = capture = _CappedWriter()
        scope = dict(namespace, _strict_eq=_strict_eq, raises=raises)
        passed, error = True, ""
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            exec(_compile_test(source, index), scope)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            passed, error = False, _error_message(exc)
        report({"event": "test", "i": index, "passed": passed, "error": error, "output": capture.value()})
    report({"event": "done"})
    os._exit(0)  # do not wait for threads the candidate may have left running


if __name__ == "__main__":
    main()
