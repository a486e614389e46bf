"""The probe runner that runs INSIDE the sandbox: load the candidate's code, run each probe.

Copied into the sandbox with the candidate's code as `solution.py` and run as
`python3 harness.py`; standard library only. Its input on stdin is one JSON object:

    {"probes": ["data = [9, 1, 5]\\n_observe(0, lambda: median(data))", ...], "per_test_timeout": 2.0}

A probe is a hidden test with every expected value taken out (see `probes.py` on the host):
each assert became `_observe(check, lambda: <the left side>)`. This process therefore holds
nothing worth stealing: it computes what the tests ask for and reports it as plain data. Whether
that data is right is decided on the host, which never sends the expected values here. A
candidate that tampers with this file, its functions or its output can only change the values it
reports, which is what solving the task does anyway.

Events, one JSON object per line on a private duplicate of the original stdout:

    {"event": "loaded"} | {"event": "load_error", "message": m}
    {"event": "observed", "test": i, "check": k, "outcome": O}
    {"event": "test_end", "test": i, "passed_run": bool, "message": m, "output": printed}
    {"event": "done"}

where O is {"value": <encoded>} (see `values.py`), {"raised": [built-in classes of the
exception's MRO], "message": m}, {"unencodable": why} or {"too_many": true}. An observation is
sent once per distinct value (an assert in a loop of 2,000 calls sends one line, not 2,000).

What the candidate prints is captured per test (print, sys.stdout/stderr) or sent to /dev/null
(fd 1 and 2), so it never mixes with the events. Each test runs under a SIGALRM timer; a test
that swallows the timer or blocks in C is ended by the sandbox's own timeout, and the host marks
the test that was running as timed out.
"""

import builtins
import io
import json
import os
import signal
import sys
import traceback

MAX_MESSAGE = 300
MAX_OUTPUT = 2000
MAX_DEPTH = 100
MAX_ENCODED = 1 << 20  # characters of one encoded value (roughly)
MAX_DISTINCT = 8  # distinct values reported per check
SOLUTION = os.path.abspath("solution.py")


class TestTimeout(BaseException):
    """Raised by the SIGALRM handler inside a test that ran past its time."""


class Unencodable(Exception):
    """A value that is not plain data (or too big or deep to send)."""


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


def encode(value):
    """`value` as tagged JSON-able data (values.py), using exact built-in types only."""
    budget = [MAX_ENCODED]

    def walk(item, depth):
        if depth > MAX_DEPTH:
            raise Unencodable("nested too deeply")
        budget[0] -= 1
        if budget[0] < 0:
            raise Unencodable("too large")
        kind = type(item)
        if item is None or kind is bool or kind is int or kind is float:
            return item
        if kind is str:
            budget[0] -= len(item)
            return item
        if kind is bytes:
            budget[0] -= 2 * len(item)
            return {"bytes": item.hex()}
        if kind is list:
            return [walk(x, depth + 1) for x in item]
        if kind is tuple:
            return {"tuple": [walk(x, depth + 1) for x in item]}
        if kind is set or kind is frozenset:
            return {kind.__name__: [walk(x, depth + 1) for x in item]}
        if kind is dict:
            return {"dict": [[walk(k, depth + 1), walk(v, depth + 1)] for k, v in item.items()]}
        raise Unencodable(f"a {kind.__name__} object is not plain data")

    data = walk(value, 0)
    if budget[0] < 0:
        raise Unencodable("too large")
    return data


def builtin_classes(exc):
    """Names of the built-in classes in the exception's MRO (a class named ValueError defined by
    the candidate is not the built-in one)."""
    return [cls.__name__ for cls in type(exc).__mro__ if cls.__module__ == "builtins"]


def describe(exc):
    try:
        if isinstance(exc, TestTimeout):
            text = "timed out"
        else:
            frames = traceback.extract_tb(exc.__traceback__)
            where = next((f"line {f.lineno}" for f in reversed(frames) if f.filename == SOLUTION), "")
            text = f"{type(exc).__name__}: {exc}" + (f" (solution.py {where})" if where else "")
        text = text if type(text) is str else "failed"
    except BaseException:  # a hostile exception whose __str__ raises or loops
        text = "failed (the exception could not be described)"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _on_alarm(signum, frame):
    raise TestTimeout()


def main():
    spec = json.loads(sys.stdin.read())
    timeout = float(spec["per_test_timeout"])
    probes = [compile(source, f"<test {i}>", "exec") for i, source in enumerate(spec["probes"])]
    with open(SOLUTION, encoding="utf-8") as f:
        candidate = f.read()

    # Bound before the candidate runs, so that ordinary code which patches builtins or sys
    # (or prints a lot) cannot break the reporting of an honest solution.
    write, dumps, set_timer, timer = os.write, json.dumps, signal.setitimer, signal.ITIMER_REAL
    run = exec
    exit_now, streams, writer = os._exit, sys, _CappedWriter
    report_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def report(**event):
        write(report_fd, (dumps(event) + "\n").encode())

    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "solution", "__file__": SOLUTION, "__builtins__": builtins}
    streams.stdout = streams.stderr = writer()
    try:
        set_timer(timer, timeout)
        run(compile(candidate, SOLUTION, "exec"), namespace)
        set_timer(timer, 0)
    except BaseException as exc:
        set_timer(timer, 0)
        report(event="load_error", message=describe(exc))
        exit_now(0)
    report(event="loaded")

    for index, probe in enumerate(probes):
        sent = {}

        def observe(check, thunk, index=index, sent=sent):
            try:
                value = thunk()
            except TestTimeout:
                raise
            except BaseException as exc:
                outcome = {"raised": builtin_classes(exc), "message": describe(exc)}
            else:
                try:
                    outcome = {"value": encode(value)}
                except Unencodable as exc:
                    outcome = {"unencodable": str(exc)}
            try:
                line = dumps(outcome)
            except ValueError:  # an int too long to print
                outcome, line = {"unencodable": "too large"}, "too large"
            seen = sent.setdefault(check, set())
            if line in seen or len(seen) > MAX_DISTINCT:
                return
            seen.add(line)
            if len(seen) > MAX_DISTINCT:
                outcome = {"too_many": True}
            report(event="observed", test=index, check=check, outcome=outcome)

        streams.stdout = streams.stderr = capture = writer()
        passed_run, message = True, ""
        try:
            set_timer(timer, timeout)
            run(probe, {**namespace, "_observe": observe})
            set_timer(timer, 0)
        except BaseException as exc:
            set_timer(timer, 0)
            passed_run, message = False, describe(exc)
        try:
            output = capture.value()
        except BaseException:
            output = ""
        report(event="test_end", test=index, passed_run=passed_run, message=message, output=output)
    report(event="done")
    exit_now(0)  # do not wait for threads the candidate may have left running


if __name__ == "__main__":
    main()
