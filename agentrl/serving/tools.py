"""OpenAI tool calling on the policy server's chat route: request fields, prompt, forced call, reply.

The server's chat handler calls `plan_chat` to turn a request (messages, `tools`, `tool_choice`)
into prompt token ids, then `ChatPlan.reply` to turn the sampled text into the assistant message
and finish reason. The text format itself (template rendering, default `<tool_call>` blocks,
parsing, forced prefixes) lives in `agentrl.tools`, shared with the rollout side so that training
episodes and OpenAI clients see one format.

`tool_choice`:
- "auto" (default when tools are given): the model decides; calls in its output are parsed.
- "none": the tools are still shown, nothing is parsed (the reply is plain content).
- "required": the assistant turn is opened with the call tag and `{"name": "`, so the model must
  write a call and only picks the tool and its arguments.
- {"type": "function", "function": {"name": N}}: the turn is opened with the call tag, the name
  and the start of the arguments object, so only the arguments are sampled.
The forced text is part of the prompt the engine receives (it was not sampled), and it is part of
the reply that is parsed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.errors import AgentRLError
from agentrl.serving.engine_api import InvalidRequest
from agentrl.tokenizer import ChatTokenizer
from agentrl.tools import forced_prefix, parse_tool_calls

# ---- request fields (the server's chat body inherits these) -------------------------------------


class FunctionCallBody(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCallBody(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallBody


class FunctionBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolBody(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionBody


class FunctionCallName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionCallName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class ToolMessageFields(BaseModel):
    """What a chat message carries besides role and content, for tool calling."""

    tool_calls: list[ToolCallBody] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def tool_fields(self) -> dict[str, Any]:
        """The fields that are set, as plain data for the chat template."""
        return self.model_dump(include={"tool_calls", "tool_call_id", "name"}, exclude_none=True)


class ToolRequestFields(BaseModel):
    tools: list[ToolBody] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True


# ---- planning a chat request --------------------------------------------------------------------


@dataclass
class ChatPlan:
    """A chat request's prompt and how to read the reply."""

    prompt_ids: list[int]
    prefix: str  # forced text already at the end of the prompt
    parse: bool  # whether calls in the reply are parsed into `tool_calls`

    def reply(self, sampled_text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """The assistant message and finish reason for the sampled text."""
        text = self.prefix + sampled_text
        if not self.parse:
            return {"role": "assistant", "content": text}, finish_reason
        parsed = parse_tool_calls(text, f"call_{uuid.uuid4().hex[:16]}_")
        calls = parsed.valid_calls
        # A malformed block stays in the content as written: the client sees it, nothing is dropped.
        malformed = [c.raw for c in parsed.calls if c.error is not None]
        content = "\n".join(part for part in (parsed.content, *malformed) if part)
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if not calls:
            message["content"] = content
            return message, finish_reason
        message["tool_calls"] = [call.openai() for call in calls]
        return message, "tool_calls" if finish_reason == "stop" else finish_reason


def plan_chat(tokenizer: ChatTokenizer, body: Any) -> ChatPlan:
    """Render a chat body's prompt (with its tools) and forced call opening. Raises `InvalidRequest`.

    `body` is the server's chat request model (`schemas.ChatBody`): messages with a `render()`,
    plus the `ToolRequestFields`.
    """
    messages = [m.render() for m in body.messages]
    tools = [t.model_dump() for t in body.tools] if body.tools else None
    requested = body.tool_choice
    tool_choice = requested.model_dump() if isinstance(requested, BaseModel) else requested
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    parse = bool(tools) and choice != "none"
    if parse and getattr(body, "stream", False):
        raise InvalidRequest(
            "stream=true with tools is not supported: send stream=false (or tool_choice none)"
        )
    if choice != "none" and not tools:
        raise InvalidRequest(f"tool_choice {_describe(choice)} needs a non-empty tools list")
    try:
        prefix = forced_prefix(choice, tools)
        prompt = tokenizer.encode_chat(messages, add_generation_prompt=True, tools=tools or None)
    except AgentRLError as exc:  # a tool_choice naming no given tool, or a template rejecting the messages
        raise InvalidRequest(str(exc)) from exc
    # Appended as its own tokens, so the prompt's template part tokenizes exactly as without it.
    prompt_ids = prompt + (tokenizer.encode(prefix) if prefix else [])
    return ChatPlan(prompt_ids, prefix, parse)


def _describe(choice: str | dict[str, Any]) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice['function']['name']!r}"
