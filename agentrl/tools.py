"""Tool calling, shared by envs, the environment manager, the rollout client and the policy server.

An env declares tools by decorating async methods with `@tool`; each becomes a `ToolSpec` (name,
description, JSON-schema parameters) that is shown to the model in the OpenAI `tools` shape.

The wire format between the model and everyone else is text. A chat template that has its own
tool format (it reads `tools` and `message.tool_calls`) is given the tools and tool messages as
they are. Any other template gets the default format, written into the messages themselves:

- the tool list goes into the system message, with an instruction to answer with
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks;
- an assistant message's `tool_calls` are written back as those blocks after its content;
- `tool` messages keep their role and carry the result text.

`parse_tool_calls` reads the blocks back out of sampled text. Text inside `<think>...</think>`
is never read as a call (a model may draft calls while reasoning). A block that is not valid
JSON, or lacks a name, is kept as a `ToolCall` with `error` set, so the caller can answer it with
a tool error instead of silently dropping it.

This module is torch-free and imports nothing from the rollout or serving sides.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import AgentRLError, InvalidArgumentError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ToolError(AgentRLError):
    """Raised by a tool method to answer the model with an error message instead of a result."""


# ---- declaring tools ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The OpenAI `tools` entry: {"type": "function", "function": {...}}."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass
class ToolResult:
    """What a tool call returns to the episode. A tool method may return a plain string instead.

    `reward`, `terminated` and `truncated` let a tool end the episode (an `answer` tool that is
    graded) exactly as `Env.astep` would; `info` is merged into the turn's info.
    """

    content: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


ToolMethod = Callable[..., Awaitable[str | ToolResult]]
_SPEC_ATTRIBUTE = "__agentrl_tool__"
_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def tool(
    func: ToolMethod | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Any:
    """Mark an async env method as a tool. Usable bare (`@tool`) or with overrides (`@tool(name=...)`).

    Without `parameters`, the JSON schema is derived from the signature: `str`, `int`, `float`,
    `bool` and `list[...]` of those are supported; parameters without a default are required.
    The description defaults to the docstring's first paragraph.
    """

    def mark(method: ToolMethod) -> ToolMethod:
        if not inspect.iscoroutinefunction(method):
            raise InvalidArgumentError(f"@tool needs an async method, {method.__qualname__} is not")
        doc = inspect.getdoc(method) or ""
        spec = ToolSpec(
            name=name or method.__name__,
            description=description if description is not None else doc.split("\n\n")[0].strip(),
            parameters=parameters if parameters is not None else _schema_from_signature(method),
        )
        setattr(method, _SPEC_ATTRIBUTE, spec)
        return method

    return mark(func) if func is not None else mark


def tool_methods(obj: object) -> dict[str, tuple[ToolSpec, ToolMethod]]:
    """The `@tool` methods of `obj` (bound), by tool name, in definition order along the MRO."""
    found: dict[str, tuple[ToolSpec, ToolMethod]] = {}
    for cls in reversed(type(obj).__mro__):
        for attr, value in vars(cls).items():
            spec = getattr(value, _SPEC_ATTRIBUTE, None)
            if isinstance(spec, ToolSpec):
                found[spec.name] = (spec, getattr(obj, attr))
    return found


def _schema_from_signature(method: Callable[..., Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(method)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(method).parameters.items():
        if pname == "self":
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise InvalidArgumentError(
                f"@tool {method.__qualname__}: *args/**kwargs cannot be described as JSON schema"
            )
        properties[pname] = _json_type(hints.get(pname, str), method.__qualname__, pname)
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _json_type(hint: Any, where: str, pname: str) -> dict[str, Any]:
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint) or (str,)
        return {"type": "array", "items": _json_type(item, where, pname)}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return _json_type(options[0], where, pname)
    raise InvalidArgumentError(
        f"@tool {where}: parameter {pname!r} has type {hint!r}; pass parameters= explicitly"
    )


# ---- validating arguments ----------------------------------------------------------------------

_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate_arguments(schema: dict[str, Any], value: Any, path: str = "arguments") -> list[str]:
    """Check `value` against the JSON-schema subset tools use; return readable problems (empty: ok).

    Supported keywords: type (one or a list), properties, required, additionalProperties (bool),
    enum, items, minimum, maximum. Others are ignored rather than guessed at.
    """
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        allowed = expected if isinstance(expected, list) else [expected]
        if not any(_TYPE_CHECKS.get(t, lambda v: True)(value) for t in allowed):
            return [f"{path} must be {' or '.join(allowed)}, got {_json_name(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path} must be <= {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path}.{key} is required")
        for key, item in value.items():
            if key in properties:
                problems += validate_arguments(properties[key], item, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                problems.append(
                    f"{path}.{key} is not a parameter (expected: {', '.join(properties) or 'none'})"
                )
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += validate_arguments(schema["items"], item, f"{path}[{i}]")
    return problems


def _json_name(value: Any) -> str:
    for name, check in _TYPE_CHECKS.items():
        if name != "number" and check(value):
            return name
    return "number" if isinstance(value, float) else type(value).__name__


# ---- calls in text -----------------------------------------------------------------------------


@dataclass
class ToolCall:
    """One call parsed out of a model's text. `arguments` is the JSON text, as OpenAI carries it.

    `error` is set for a block that could not be read as a call (bad JSON, no name, unterminated);
    `name` and `arguments` then hold what could be recovered (possibly empty).
    """

    id: str
    name: str
    arguments: str
    error: str | None = None
    raw: str = ""  # the block as the model wrote it, tags included

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ParsedOutput:
    """A model turn split into its visible text and its tool calls (valid and malformed)."""

    content: str
    calls: list[ToolCall]

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c.error is None]


def parse_tool_calls(text: str, id_prefix: str = "call_") -> ParsedOutput:
    """Split `text` into content and `<tool_call>` blocks, skipping `<think>` sections.

    Call ids are `id_prefix` + the call's index in the turn, so a caller that wants globally unique
    ids (the server) passes a unique prefix, and one that wants reproducible ids passes its own.
    """
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for start, end in _outside_think(text):
        cursor = start
        while True:
            at = text.find(CALL_OPEN, cursor, end)
            if at < 0:
                break
            content.append(text[pos:at])
            body_start = at + len(CALL_OPEN)
            close = text.find(CALL_CLOSE, body_start, end)
            call_id = f"{id_prefix}{len(calls)}"
            if close < 0:
                message = f"the tool call is not closed with {CALL_CLOSE}"
                calls.append(ToolCall(call_id, "", text[body_start:end].strip(), message, text[at:end]))
                pos = cursor = end
                break
            pos = cursor = close + len(CALL_CLOSE)
            for call in _read_block(id_prefix, len(calls), text[body_start:close]):
                call.raw = text[at:pos]
                calls.append(call)
    content.append(text[pos:])
    return ParsedOutput("".join(content).strip(), calls)


def _outside_think(text: str) -> list[tuple[int, int]]:
    """The [start, end) spans of `text` that are not inside a <think>...</think> section."""
    spans, pos = [], 0
    while True:
        at = text.find(THINK_OPEN, pos)
        if at < 0:
            spans.append((pos, len(text)))
            return spans
        spans.append((pos, at))
        close = text.find(THINK_CLOSE, at + len(THINK_OPEN))
        if close < 0:  # an unclosed think section runs to the end of the turn
            return spans
        pos = close + len(THINK_CLOSE)


def _read_block(id_prefix: str, first: int, body: str) -> list[ToolCall]:
    """The calls in one closed block: one JSON object, or a JSON list of them (some models' habit)."""
    raw = body.strip()
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        message = f"the tool call is not valid JSON: {exc.msg} (at char {exc.pos})"
        return [ToolCall(f"{id_prefix}{first}", "", raw, message)]
    items = obj if isinstance(obj, list) and obj else [obj]
    return [_call_from_json(f"{id_prefix}{first + i}", item, raw) for i, item in enumerate(items)]


def _call_from_json(call_id: str, obj: Any, raw: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(
            call_id, "", raw, 'a tool call must be a JSON object {"name": ..., "arguments": {...}}'
        )
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write arguments as a JSON string, as OpenAI carries them
        return ToolCall(call_id, obj["name"], args)
    return ToolCall(call_id, obj["name"], json.dumps(args, ensure_ascii=False))


def decode_arguments(call: ToolCall) -> tuple[dict[str, Any] | None, str | None]:
    """The call's arguments as a dict, or an error message saying why they are not one."""
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"the arguments of {call.name!r} are not valid JSON: {exc.msg}"
    if not isinstance(args, dict):
        return None, f"the arguments of {call.name!r} must be a JSON object, got {_json_name(args)}"
    return args, None


# ---- rendering ---------------------------------------------------------------------------------

_NATIVE_TEMPLATE = re.compile(r"\btool_calls\b|\btools\b")

TOOLS_INSTRUCTION = (
    "# Tools\n\n"
    "You can call these functions (JSON schema signatures):\n<tools>\n{tools}\n</tools>\n\n"
    "To call one, write its name and arguments as a JSON object between <tool_call> and "
    "</tool_call>, one block per call:\n"
    '<tool_call>\n{{"name": "function_name", "arguments": {{"argument": "value"}}}}\n</tool_call>'
)


def template_has_tool_format(template: str) -> bool:
    """Whether a chat template renders tools itself (it reads `tools` or `message.tool_calls`)."""
    return bool(_NATIVE_TEMPLATE.search(template))


def format_call(name: str, arguments: str | dict[str, Any]) -> str:
    """The default format's text for one call (what `parse_tool_calls` reads back)."""
    args: Any = arguments or {}
    if isinstance(arguments, str) and arguments.strip():
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError:
            args = arguments  # history may hold a malformed call: show it as it was written
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def forced_prefix(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None = None) -> str:
    """The text that opens the assistant's turn when a call is forced, or "" when it is not.

    `"required"` opens a call block up to the tool's name (the model picks the tool). A named
    choice (`{"type": "function", "function": {"name": N}}`) writes the name and opens the
    arguments object up to its first key, so the model fills in arguments and cannot drift into
    prose or into copying the schema; a tool without parameters gets its whole call written.
    "auto", "none" and None force nothing.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice == "required":
        return f'{CALL_OPEN}\n{{"name": "'
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(
            f"tool_choice must be auto, none, required or a named function, got {tool_choice!r}"
        )
    head = f'{CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
    spec = next((t["function"] for t in tools or [] if t.get("function", {}).get("name") == name), None)
    if spec is None:
        known = ", ".join(t.get("function", {}).get("name", "?") for t in tools or [])
        raise InvalidArgumentError(
            f"tool_choice names {name!r}, which is not among the tools ({known or 'none'})"
        )
    if (spec.get("parameters") or {}).get("properties"):
        return head + '{"'
    return head + f"{{}}}}\n{CALL_CLOSE}"


def template_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, native: bool
) -> list[dict[str, Any]]:
    """The messages a chat template is given, in its own tool format (native) or the default one."""
    if native:
        return [_native_message(m) for m in messages]
    out = [_default_message(m) for m in messages]
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        instruction = TOOLS_INSTRUCTION.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = out[0] | {"content": f"{out[0]['content']}\n\n{instruction}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def _default_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if message.get("role") == "assistant" and calls:
        blocks = [format_call(c["function"]["name"], c["function"].get("arguments", "{}")) for c in calls]
        content = "\n".join([content, *blocks]) if content else "\n".join(blocks)
    return {"role": message["role"], "content": content}


def _native_message(message: dict[str, Any]) -> dict[str, Any]:
    """HF tool templates expect `arguments` as a dict (OpenAI sends a JSON string)."""
    calls = message.get("tool_calls")
    out = dict(message)
    out["content"] = message.get("content") or ""
    if calls:
        out["tool_calls"] = [_native_call(c) for c in calls]
    return out


def _native_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        # a malformed string stays text: the template shows what the model wrote
        with contextlib.suppress(json.JSONDecodeError):
            function["arguments"] = json.loads(args) if args.strip() else {}
    return call | {"function": function}
