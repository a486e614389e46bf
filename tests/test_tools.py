"""Tool calling without a model: the parser, schemas, Env.call_tool, rendering, manager routing."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from agentrl.core import Env
from agentrl.errors import AgentRLError
from agentrl.rollout.manager import EnvManager
from agentrl.rollout.protocol import PolicyInput
from agentrl.tools import (
    ToolCall,
    ToolError,
    ToolResult,
    forced_prefix,
    format_call,
    parse_tool_calls,
    template_has_tool_format,
    template_messages,
    tool,
    validate_arguments,
)
from agentrl.trajectory import StopReason

# ---- the parser ---------------------------------------------------------------------------------


def test_calls_inside_think_are_ignored():
    text = (
        '<think>maybe <tool_call>{"name": "search", "arguments": {"query": "draft"}}</tool_call></think>'
        'Searching now.<tool_call>{"name": "search", "arguments": {"query": "final"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert [json.loads(c.arguments) for c in parsed.calls] == [{"query": "final"}]
    unclosed = parse_tool_calls('<think>still thinking <tool_call>{"name": "a"}</tool_call>')
    assert unclosed.calls == []


def test_malformed_json_is_flagged_not_dropped():
    parsed = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"query": }</tool_call> ok')
    (call,) = parsed.calls
    assert call.error is not None and "not valid JSON" in call.error
    assert call.raw.startswith("<tool_call>") and parsed.valid_calls == []
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>').calls[0].error is not None
    unterminated = parse_tool_calls('<tool_call>{"name": "search", "argu')
    assert "not closed" in unterminated.calls[0].error


def test_several_calls_in_one_turn_get_their_own_ids():
    text = (
        "I will do both.\n"
        + format_call("search", {"query": "boots"})
        + "\n"
        + format_call("click", {"element": 3})
        + '<tool_call>[{"name": "back", "arguments": {}},'
        + ' {"name": "answer", "arguments": "{\\"text\\": \\"x\\"}"}]</tool_call>'
    )
    parsed = parse_tool_calls(text, "call_7_")
    assert [c.name for c in parsed.calls] == ["search", "click", "back", "answer"]
    assert [c.id for c in parsed.calls] == ["call_7_0", "call_7_1", "call_7_2", "call_7_3"]
    assert json.loads(parsed.calls[3].arguments) == {"text": "x"}
    assert parsed.content == "I will do both."


def test_required_and_named_choices_force_the_call_opening():
    tools = [spec.openai() for spec in Lookup().tools()] + [
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    ]
    assert forced_prefix("auto", tools) == forced_prefix("none", tools) == forced_prefix(None) == ""
    assert forced_prefix("required", tools) == '<tool_call>\n{"name": "'
    named = forced_prefix({"type": "function", "function": {"name": "lookup"}}, tools)
    assert named == '<tool_call>\n{"name": "lookup", "arguments": {"'
    # what a model appends after the forced opening parses as a call to the named tool
    (call,) = parse_tool_calls(named + 'key": "France"}}\n</tool_call>').calls
    assert (call.name, json.loads(call.arguments), call.error) == ("lookup", {"key": "France"}, None)
    # a tool without parameters is called whole
    ping = forced_prefix({"type": "function", "function": {"name": "ping"}}, tools)
    assert parse_tool_calls(ping).valid_calls[0].name == "ping"
    with pytest.raises(AgentRLError, match="tool_choice"):
        forced_prefix("sometimes", tools)
    with pytest.raises(AgentRLError, match="not among the tools"):
        forced_prefix({"type": "function", "function": {"name": "missing"}}, tools)


# ---- declaring and calling tools ---------------------------------------------------------------


class Lookup(Env):
    """A text env with two tools; `answer` ends the episode."""

    system_prompt = "Look things up."
    tool_error_penalty = -0.25

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.steps = 0
        return "What is the capital of France?", {}

    async def astep(self, action):
        self.steps += 1
        return f"you said {action}", 0.0, False, self.steps >= 3, {}

    @tool
    async def lookup(self, key: str, limit: int = 1) -> str:
        """Look a key up in the encyclopedia."""
        if key == "forbidden":
            raise ToolError("that key is not available")
        return f"{key}: Paris" if "France" in key else f"{key}: unknown"

    @tool(name="answer", description="Give the final answer.")
    async def give_answer(self, text: str) -> ToolResult:
        correct = text.strip().lower() == "paris"
        return ToolResult(
            "Correct." if correct else "Wrong.", float(correct), True, info={"success": correct}
        )


def test_tool_schema_comes_from_the_signature():
    specs = {spec.name: spec for spec in Lookup().tools()}
    assert set(specs) == {"lookup", "answer"}
    assert specs["lookup"].description == "Look a key up in the encyclopedia."
    assert specs["lookup"].parameters == {
        "type": "object",
        "properties": {"key": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["key"],
        "additionalProperties": False,
    }
    assert specs["answer"].openai()["function"]["name"] == "answer"
    with pytest.raises(TypeError, match="async"):
        tool(lambda self: "x")


def test_validate_arguments_names_each_problem():
    schema = Lookup().tools()[0].parameters
    assert validate_arguments(schema, {"key": "x", "limit": 2}) == []
    problems = validate_arguments(schema, {"limit": "two", "extra": 1})
    assert "arguments.key is required" in problems
    assert "arguments.limit must be integer, got string" in problems
    assert any("arguments.extra is not a parameter" in p for p in problems)
    assert validate_arguments({"type": "integer", "minimum": 1}, 0) == ["arguments must be >= 1"]
    assert validate_arguments({"enum": ["a", "b"]}, "c")[0].startswith("arguments must be one of")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (ToolCall("c", "", "{oops", "the tool call is not valid JSON"), "not valid JSON"),
        (ToolCall("c", "wikipedia", "{}"), "unknown tool 'wikipedia'; available: lookup, answer"),
        (ToolCall("c", "lookup", '{"limit": 1}'), "arguments.key is required"),
        (ToolCall("c", "lookup", '["France"]'), "must be a JSON object"),
        (ToolCall("c", "lookup", '{"key": 1'), "are not valid JSON"),
    ],
)
async def test_malformed_calls_get_an_error_message_and_the_env_penalty(call, message):
    env = Lookup()
    await env.areset(seed=0)
    result = await env.call_tool(call)
    assert result.content.startswith("Error: ") and message in result.content
    assert result.reward == -0.25 and result.info["format_error"] and not result.terminated


async def test_a_tool_error_is_answered_without_penalty():
    env = Lookup()
    await env.areset(seed=0)
    result = await env.call_tool(ToolCall("c", "lookup", '{"key": "forbidden"}'))
    assert result.content == "Error: that key is not available" and result.reward == 0.0


# ---- rendering ---------------------------------------------------------------------------------


def test_default_format_writes_tools_calls_and_results_into_the_messages():
    tools = [spec.openai() for spec in Lookup().tools()]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "France: Paris"},
    ]
    out = template_messages(messages, tools, native=False)
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and '"name": "lookup"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": format_call("lookup", {})}
    assert out[3] == {"role": "tool", "content": "France: Paris"}
    native = template_messages(messages, tools, native=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {}  # HF templates want a dict
    assert template_has_tool_format("{% for tool in tools %}{{ tool | tojson }}{% endfor %}")
    assert not template_has_tool_format("{{ message['content'] }}")


def test_the_project_tokenizer_renders_tool_turns_incrementally(tokenizer):
    tools = [spec.openai() for spec in Lookup().tools()]
    text = tokenizer.continuation_text(
        [{"role": "tool", "content": "France: Paris"}], closed=True, tools=tools
    )
    assert text == "\n<|im_start|>tool\nFrance: Paris<|im_end|>\n<|im_start|>assistant\n"


# ---- the manager routes calls ------------------------------------------------------------------


class ScriptedCaller:
    """Plays fixed turns: malformed calls, a good lookup, a text step, then the answer."""

    TURNS: ClassVar[list[str]] = [
        '<tool_call>{"name": "lookup", "arguments": {"key": }</tool_call>'
        + format_call("wikipedia", {"q": "France"}),
        format_call("lookup", {"key": "France"}),
        "I think I know.",
        format_call("answer", {"text": "Paris"}) + format_call("lookup", {"key": "late"}),
    ]

    def __init__(self) -> None:
        self.seen: list[PolicyInput] = []

    async def __call__(self, request: PolicyInput) -> str:
        self.seen.append(request)
        return self.TURNS[request.turn]


async def test_manager_mixes_tool_turns_and_env_steps_and_answers_every_call():
    policy = ScriptedCaller()
    async with EnvManager(Lookup, policy) as manager:
        (group,) = await manager.run([0])
    (trajectory,) = group.trajectories
    assert trajectory.stop_reason is StopReason.TERMINATED and trajectory.success
    rewards = [turn.reward for turn in trajectory.turns]
    assert rewards == [-0.5, 0.0, 0.0, 1.0]  # two malformed calls at -0.25 each, then the answer
    first = trajectory.turns[0].info
    assert first["format_error"] and [c["error"] is not None for c in first["tool_calls"]] == [True, True]
    last = trajectory.turns[-1].info["tool_calls"]
    assert last[1]["result"] == "Error: not run, the episode ended at an earlier call"
    assert manager.stats.tool_calls == 5 and manager.stats.env_steps == 1
    # the policy saw the tools every turn, and each call answered by a tool message with its id
    assert policy.seen[0].tools is not None and {t["function"]["name"] for t in policy.seen[0].tools} == {
        "lookup",
        "answer",
    }
    messages = policy.seen[-1].messages
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "user"]
    calls = messages[2]["tool_calls"]
    assert [m["tool_call_id"] for m in messages[3:5]] == [c["id"] for c in calls] == ["call_0_0", "call_0_1"]
    assert messages[6]["content"] == "France: Paris" and messages[8]["content"] == "you said I think I know."
