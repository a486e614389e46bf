"""Values that cross from the sandbox to the host: plain data only, judged with exact types.

The sandbox (`harness.py`) encodes what a candidate's call returned as JSON with explicit tags:
None, bool, int, float (NaN and infinities included), str and list are JSON's own; a tuple is
`{"tuple": [...]}`, a dict `{"dict": [[key, value], ...]}`, a set `{"set": [...]}`, a frozenset
`{"frozenset": [...]}`, bytes `{"bytes": "<hex>"}`. Anything else (an instance of any other
class, a subclass of a built-in type) cannot be encoded and fails its check.

`decode()` rebuilds only built-in objects from that text, so nothing the candidate controls (a
custom `__eq__`, a metaclass, a lying `__repr__`) exists on the host; `same()` then compares
with exact types. The text itself is untrusted: every malformed shape raises `BadValue`.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl.errors import AgentRLError

MAX_DEPTH = 100
_SCALARS = (str, bool, type(None))
_HASHABLE_TAGS = {"tuple", "frozenset", "bytes"}


class BadValue(AgentRLError, ValueError):
    """The sandbox sent something that is not a well-formed encoded value."""


def decode(data: Any, depth: int = 0) -> Any:
    """The host object for one encoded value (see the module docstring)."""
    if depth > MAX_DEPTH:
        raise BadValue("value nested too deeply")
    kind = type(data)
    if kind in _SCALARS or kind is int or kind is float:
        return data
    if kind is list:
        return [decode(item, depth + 1) for item in data]
    if kind is not dict or len(data) != 1:
        raise BadValue(f"unexpected encoded shape {kind.__name__}")
    ((tag, body),) = data.items()
    try:
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise BadValue(f"{tag!r} needs a list")
        items = [decode(item, depth + 1) for item in body]
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(items)
        if tag == "frozenset":
            return frozenset(items)
        if tag == "dict":
            if not all(type(pair) is list and len(pair) == 2 for pair in items):
                raise BadValue("dict items must be [key, value] pairs")
            return {key: value for key, value in items}
    except TypeError as exc:  # an unhashable set member or dict key
        raise BadValue(str(exc)) from exc
    except ValueError as exc:  # bad hex
        raise BadValue(str(exc)) from exc
    raise BadValue(f"unknown tag {tag!r}")


def same(actual: Any, expected: Any) -> bool:
    """Equality with exact types: 1 is not True, (1,) is not [1]; floats compare within 1e-9."""
    kind, expected_kind = type(actual), type(expected)
    numbers = (int, float)
    if kind in numbers and expected_kind in numbers:
        if kind is float or expected_kind is float:
            return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
        return bool(actual == expected)
    if kind is not expected_kind:
        return False
    if kind is list or kind is tuple:
        return len(actual) == len(expected) and all(same(a, e) for a, e in zip(actual, expected, strict=True))
    if kind is dict:
        return actual.keys() == expected.keys() and all(same(actual[k], expected[k]) for k in expected)
    return bool(actual == expected)  # str, bytes, bool, None, set, frozenset: built-in equality


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
