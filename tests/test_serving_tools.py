"""The chat route's tool plan: prompt with the forced opening, reply parsing, request errors."""

from __future__ import annotations

import pytest

from agentrl.serving.engine_api import InvalidRequest
from agentrl.serving.schemas import ChatBody
from agentrl.serving.tools import plan_chat

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = {"role": "user", "content": "Weather in Paris?"}


def body(**fields) -> ChatBody:
    return ChatBody.model_validate({"messages": [QUESTION], **fields})


def test_required_choice_forces_the_call_opening_into_the_prompt(tokenizer):
    plan = plan_chat(tokenizer, body(tools=[WEATHER], tool_choice="required"))
    text = tokenizer.decode(plan.prompt_ids)
    assert text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "') and '"get_weather"' in text
    # the sampled rest completes the call; several calls and a malformed block in one turn
    sampled = (
        'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": oops</tool_call>'
    )
    message, finish_reason = plan.reply(sampled, "stop")
    assert finish_reason == "tool_calls"
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message["content"] == '<tool_call>{"name": oops</tool_call>'  # flagged, kept, not dropped
    assert plan.reply(sampled, "length")[1] == "length"


def test_auto_parses_calls_and_none_leaves_text_alone(tokenizer):
    text = '<think><tool_call>{"name": "get_weather"}</tool_call></think>Let me check.'
    message, reason = plan_chat(tokenizer, body(tools=[WEATHER])).reply(text, "stop")
    assert (message, reason) == ({"role": "assistant", "content": text}, "stop")  # only a call in <think>
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    message, reason = plan_chat(tokenizer, body(tools=[WEATHER], tool_choice="none")).reply(call, "stop")
    assert message == {"role": "assistant", "content": call} and reason == "stop"


def test_history_with_tool_calls_and_results_renders(tokenizer):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [
        QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    plan = plan_chat(tokenizer, ChatBody.model_validate({"messages": history, "tools": [WEATHER]}))
    text = tokenizer.decode(plan.prompt_ids)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    )
    assert text.endswith("<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": "required"}, "needs a non-empty tools list"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "not among the tools",
        ),
    ],
)
def test_tool_choice_errors_are_bad_requests(tokenizer, fields, message):
    with pytest.raises(InvalidRequest, match=message):
        plan_chat(tokenizer, body(**fields))
