"""Split each hidden test into what the sandbox may see (probes) and what only the host knows (checks).

A test is a small Python snippet written by the task author, e.g.

    data = [9, 1, 5]
    assert median(data) == 5.0
    assert data == [9, 1, 5]

The sandbox must never see an expected value: code that can read the test (by walking frames,
scanning memory, reading /proc) could otherwise return the answer it finds there. So each
`assert` is replaced by an *observation* of its left side only:

    data = [9, 1, 5]
    _observe(0, lambda: median(data))
    _observe(1, lambda: data)

and the host keeps the check that belongs to each observation (`== 5.0`, `== [9, 1, 5]`), with
the expected value evaluated on the host from the test's own source. What the sandbox sends back
is plain data (see `values.py`), judged here. The probe gives nothing away about the kind of
check either: `assert raises(ValueError, f, x)` becomes `_observe(k, lambda: f(x))`, exactly like
an equality, so a candidate cannot tell which calls are expected to raise.

Supported assert forms (anything else is rejected when the task loads, so a task can never be
graded in a way that leaks):
- `assert ACTUAL == EXPECTED` where EXPECTED uses no name of the test or the candidate (literals,
  builtins, comprehensions): checked with exact types (`values.same`);
- `assert ACTUAL is True | False | None`;
- `assert raises(ExcType, func, *args)` with a built-in exception type: the call must raise that
  type or a subclass of it (by the built-in classes in the exception's MRO).
Every check must be observed at least once, and every observation of it must pass; an assert in
a loop is observed once per distinct value.
"""

from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass
from typing import Any

from agentrl.errors import InvalidArgumentError

OBSERVE = "_observe"
_RAISES = "raises"
_SAFE_NAMES = frozenset(name for name in dir(builtins) if not name.startswith("_"))
_IS_CONSTANTS = (True, False, None)


@dataclass(frozen=True)
class Check:
    """What one observation must satisfy; never sent to the sandbox."""

    kind: str  # "equal" | "is" | "raises"
    expected: Any = None  # the value for "equal"/"is"; the exception class name for "raises"
    source: str = ""  # the original assert, for messages


@dataclass(frozen=True)
class SplitTest:
    """One hidden test: the probe source for the sandbox and the host-only checks it feeds."""

    source: str
    probe: str
    checks: tuple[Check, ...]


class UnsupportedTestForm(InvalidArgumentError):
    """A test uses a form the host cannot judge without sending secrets to the sandbox.

    A `ValueError` too, so the task loader's validation reports it with the task's name.
    """


def _free_names(node: ast.AST) -> set[str]:
    """Names read by `node` that no comprehension inside it binds."""
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - bound


def _host_value(node: ast.expr, where: str) -> Any:
    """Evaluate an expected-value expression on the host; it may use only builtins."""
    unknown = _free_names(node) - _SAFE_NAMES
    if unknown:
        raise UnsupportedTestForm(
            f"{where}: the expected value uses {sorted(unknown)}; it must be computable without the "
            "test's variables or the candidate's code (literals, builtins, comprehensions)"
        )
    code = compile(ast.Expression(node), where, "eval")
    try:
        return eval(code, {"__builtins__": builtins})  # trusted task source, never candidate code
    except Exception as exc:
        raise UnsupportedTestForm(f"{where}: the expected value raises {type(exc).__name__}: {exc}") from exc


def _observe_call(index: int, actual: ast.expr) -> ast.Expr:
    thunk = ast.Lambda(
        ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), actual
    )
    return ast.Expr(ast.Call(ast.Name(OBSERVE, ast.Load()), [ast.Constant(index), thunk], []))


class _Splitter(ast.NodeTransformer):
    def __init__(self, where: str) -> None:
        self.where = where
        self.checks: list[Check] = []

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        text = ast.unparse(node)
        actual, check = self._split(node.test, text)
        self.checks.append(check)
        return ast.copy_location(_observe_call(len(self.checks) - 1, actual), node)

    def _split(self, test: ast.expr, text: str) -> tuple[ast.expr, Check]:
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            if isinstance(op, ast.Eq):
                return test.left, Check("equal", _host_value(right, self.where), text)
            if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in _IS_CONSTANTS:
                return test.left, Check("is", right.value, text)
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == _RAISES:
            if len(test.args) >= 2 and not test.keywords and isinstance(test.args[0], ast.Name):
                exc_name = test.args[0].id
                exc_type = getattr(builtins, exc_name, None)
                if isinstance(exc_type, type) and issubclass(exc_type, BaseException):
                    call = ast.Call(test.args[1], list(test.args[2:]), [])
                    return call, Check("raises", exc_name, text)
            raise UnsupportedTestForm(f"{self.where}: use raises(BuiltinError, func, *args), got {text!r}")
        raise UnsupportedTestForm(
            f"{self.where}: unsupported assert {text!r}; use `assert X == EXPECTED`, "
            "`assert X is True/False/None` or `assert raises(Error, func, *args)`"
        )


def plan_test(source: str, index: int = 0) -> SplitTest:
    """Split one test; raises `UnsupportedTestForm` naming what is wrong."""
    where = f"tests[{index}]"
    tree = ast.parse(source)
    splitter = _Splitter(where)
    tree = ast.fix_missing_locations(splitter.visit(tree))
    if not splitter.checks:
        raise UnsupportedTestForm(f"{where}: a test needs at least one assert")
    names = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    if _RAISES in names or names.count(OBSERVE) != len(splitter.checks):
        raise UnsupportedTestForm(f"{where}: `raises` and `{OBSERVE}` may only appear as the asserts above")
    return SplitTest(source, ast.unparse(tree), tuple(splitter.checks))


@functools.lru_cache(maxsize=1024)
def plan_tests(tests: tuple[str, ...]) -> tuple[SplitTest, ...]:
    """The plans of a task's tests (cached: a task's tests are split once per process)."""
    return tuple(plan_test(source, index) for index, source in enumerate(tests))
