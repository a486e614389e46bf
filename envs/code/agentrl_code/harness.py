"""The test harness that runs INSIDE the sandbox: load candidate code, run each hidden test.

This file is copied into the sandbox and run as `python3 harness.py`; it uses only the standard
library. Its input arrives on stdin as one JSON object (so that the hidden tests never sit in a
file the candidate code could open):

    {"nonce": "...", "code": "<candidate source>", "tests": ["assert f(1) == 2", ...],
     "per_test_timeout": 2.0}

It reports on a private duplicate of the original stdout, one line per event, flushed as it goes
(so a run killed half-way still tells which tests finished). Text fields are hex-encoded UTF-8:

    <nonce> loaded                                  the candidate code ran without error
    <nonce> load_error <message>                    it did not (syntax error, exception, exit)
    <nonce> test <index> <1|0> <message> <output>   one test passed (1) or failed (0)
    <nonce> done

Why the precautions: the candidate is untrusted and runs in this same interpreter, after the
harness has set everything up.
- The nonce is random per run and only ever on stdin, so printing fake report lines cannot match
  it; everything the candidate writes (print, sys.__stdout__, fd 1 or fd 2) is captured or sent to
  /dev/null, never to the report channel.
- Before the candidate runs, the tests are compiled, and every function the harness needs later
  (exec, os.write, the equality check, the builtins it uses) is bound to a local name, so
  patching `builtins`, `os`, `json`, `ast` or this module's globals cannot fake a pass.
- `assert actual == expected` in a test is checked by a strict equality that compares exact
  types as well as values, so an object whose `__eq__` always returns True does not pass.
- Each test runs under a SIGALRM timer; a test that loops is reported as timed out. A loop that
  swallows the timer's exception or blocks in C is ended by the sandbox's own timeout, and the
  host side marks the test that was running as timed out.
- `SystemExit` and every other `BaseException` from a test count as that test's failure.
What it cannot stop: code that deliberately walks the interpreter's frames (sys._getframe,
sys.settrace, gc) to read the nonce or rewrite the harness's locals. The sandbox contains what
such code can do to the machine, not what it reports.
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
SCALARS = (int, float, str, bytes, bool, type(None))


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


def _make_strict_eq():
    """The `_strict_eq(actual, expected)` that rewritten asserts call, with builtins bound now.

    Types are compared by identity (`is`), never with `==` or `in`, because a metaclass can
    make `==` between classes lie.
    """
    type_, len_, all_, any_, zip_, repr_, isclose = type, len, all, any, zip, repr, math.isclose
    error, scalars = AssertionError, SCALARS

    def is_one_of(kind, kinds):
        return any_(kind is k for k in kinds)

    def same(actual, expected):
        kind, expected_kind = type_(actual), type_(expected)
        numbers = (int, float)  # exact types: bool and int subclasses are excluded
        if is_one_of(kind, numbers) and is_one_of(expected_kind, numbers):
            if kind is float or expected_kind is float:
                return isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
            return actual == expected
        if kind is not expected_kind:
            return False
        if kind is list or kind is tuple:
            return len_(actual) == len_(expected) and all_(same(a, e) for a, e in zip_(actual, expected))
        if kind is dict:
            return actual.keys() == expected.keys() and all_(same(actual[k], expected[k]) for k in expected)
        if kind is set or kind is frozenset:
            return all_(is_one_of(type_(x), scalars) for x in actual) and actual == expected
        if is_one_of(kind, scalars):
            return actual == expected
        return (expected == actual) is True

    def short(value):
        try:
            text = repr_(value)
            text = text if type_(text) is str else "<bad repr>"
        except BaseException:  # a hostile __repr__ must not break the report
            text = "<unrepresentable value>"
        return text if len_(text) <= 120 else text[:117] + "..."

    def strict_eq(actual, expected):
        if not same(actual, expected):
            raise error(f"got {short(actual)}, expected {short(expected)}")

    return strict_eq


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
        text = _describe(exc)
        text = text if type(text) is str else "failed"
    except BaseException:  # a hostile exception whose __str__ raises or loops
        text = "failed (the exception could not be described)"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _describe(exc):
    if isinstance(exc, TestTimeout):
        return "timed out"
    if isinstance(exc, AssertionError):
        return str(exc) or "assertion failed"
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"line {f.lineno}" for f in reversed(frames) if f.filename == "solution.py"), "")
    return f"{type(exc).__name__}: {exc}" + (f" (solution.py {where})" if where else "")


def _on_alarm(signum, frame):
    raise TestTimeout()


def main():
    spec = json.loads(sys.stdin.read())
    nonce = str(spec["nonce"])
    timeout = float(spec["per_test_timeout"])
    tests = [(f"{index:d}", _compile_test(source, index)) for index, source in enumerate(spec["tests"])]
    candidate = spec["code"]
    del spec

    # Everything used after the candidate runs is bound here, before it can patch anything.
    write, set_timer, timer, run = os.write, signal.setitimer, signal.ITIMER_REAL, exec
    describe, strict_eq, check_raises, writer = _error_message, _make_strict_eq(), raises, _CappedWriter
    exit_now, streams = os._exit, sys
    report_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def report(*fields):
        write(report_fd, (" ".join((nonce, *fields)) + "\n").encode())

    def hexed(text):
        return text.encode("utf-8", "replace").hex()

    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "solution", "raises": check_raises}
    streams.stdout = streams.stderr = writer()
    try:
        set_timer(timer, timeout)
        run(compile(candidate, "solution.py", "exec"), namespace)
        set_timer(timer, 0)
    except BaseException as exc:
        set_timer(timer, 0)
        report("load_error", hexed(describe(exc)))
        exit_now(0)
    report("loaded")
    for index, test in tests:
        streams.stdout = streams.stderr = capture = writer()
        passed, error = "1", ""
        try:
            set_timer(timer, timeout)
            run(test, {**namespace, "_strict_eq": strict_eq, "raises": check_raises})
            set_timer(timer, 0)
        except BaseException as exc:
            set_timer(timer, 0)
            passed, error = "0", describe(exc)
        try:
            output = capture.value()
        except BaseException:
            output = ""
        report("test", index, passed, hexed(error), hexed(output))
    report("done")
    exit_now(0)  # do not wait for threads the candidate may have left running


if __name__ == "__main__":
    main()
