"""The environment contract: a gymnasium `Env` whose observations and actions are text.

The async methods `areset` and `astep` are the primary interface: the environment manager
awaits them so that thousands of environments share one event loop. `reset` and `step` are
synchronous adapters so that gymnasium tooling (`check_env`, wrappers, plain loops) works.

Write an environment by subclassing `Env` and overriding `areset` and `astep`:

    class Guess(Env):
        system_prompt = "Guess my number between 1 and 10. Answer with <answer>N</answer>."

        async def areset(self, *, seed=None, options=None):
            await super().areset(seed=seed)           # seeds self.np_random
            self.target = int(self.np_random.integers(1, 11))
            return "Make a guess.", {}

        async def astep(self, action):
            ...
            return observation, reward, terminated, truncated, info

Conventions the rest of agentrl relies on:
- `info["success"]` (bool) on the final step says whether the task was solved.
- `info["format_error"]` (bool) marks an action that could not be parsed; the env should give
  a format penalty and return the same state rather than raise.
- Raising from `astep` is allowed: the manager records the episode with stop reason `error`.
- `reference_policies` names scripted players (e.g. "random": right format, ignores the env's
  replies; "expert"), played by `reference_action(name)`. Evaluation reports each beside the
  model on the same seeds, so a success rate comes with its floor and its ceiling.

Tools: an env may also declare tools, async methods marked `@tool` (see `agentrl.tools`):

    class Calc(Env):
        tool_error_penalty = -0.2                      # per malformed call (the env's choice)

        @tool
        async def add(self, a: float, b: float) -> str:
            '''Add two numbers.'''
            return str(a + b)

The manager shows them to the policy (OpenAI `tools` shape), routes each call the model writes to
`call_tool`, and feeds the results back as `tool` messages; a turn without a call goes to `astep`
as before, so an episode can mix tool turns and env steps. A tool returns a string, or a
`ToolResult` whose reward/terminated/truncated end the episode like a step would.

"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Coroutine
from typing import Any, ClassVar, NotRequired, TypedDict, TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces

from agentrl.errors import AgentRLError, UnknownReferencePolicy
from agentrl.tools import (
    ToolCall,
    ToolError,
    ToolResult,
    ToolSpec,
    decode_arguments,
    tool_methods,
    validate_arguments,
)

T = TypeVar("T")


class ChatMessage(TypedDict):
    role: str
    content: str
    tool_calls: NotRequired[list[dict[str, Any]]]  # an assistant turn's calls, OpenAI-shaped
    tool_call_id: NotRequired[str]  # a `tool` message: the call it answers
    name: NotRequired[str]  # a `tool` message: the tool's name


class TextSpace(spaces.Text):
    """Any string up to `max_length` characters (gymnasium's `Text` only admits its charset)."""

    def __init__(self, max_length: int = 1 << 16, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"


class Env(gymnasium.Env[str, str]):
    """A text environment. Override `areset` and `astep`; everything else has a default."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (gymnasium declares it per instance)
    observation_space: spaces.Space[str] = TextSpace()
    action_space: spaces.Space[str] = TextSpace()

    #: Instructions shown to the agent once, as the system message of the conversation.
    system_prompt: str = ""

    #: Reward given for each malformed tool call (bad JSON, unknown tool, wrong arguments).
    tool_error_penalty: float = -0.1

    #: Scripted reference policies, name -> what the player does. `agentrl eval` and
    #: `agentrl train` play each on the model's held-out seeds and print its success beside the
    #: model's: a player in the right format that ignores every observation is the floor a
    #: multi-turn agent must beat to show it uses the env's feedback, the expert the ceiling.
    reference_policies: ClassVar[dict[str, str]] = {}

    _sync_loop: asyncio.AbstractEventLoop | None = None

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a new episode and return `(observation, info)`.

        Subclasses call `await super().areset(seed=seed)` first: it seeds `self.np_random`
        exactly as gymnasium's `reset` does (same seed, same episode). The base returns an empty
        observation, which subclasses replace with their own.
        """
        gymnasium.Env.reset(self, seed=seed, options=options)
        return "", {}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the agent's action text; return `(observation, reward, terminated, truncated, info)`.

        `terminated` means the task reached an end state (solved or failed for good);
        `truncated` means the episode was cut short (turn limit) and could have gone on.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement astep()")

    async def aclose(self) -> None:
        """Release resources (connections, sandboxes). Called once when the episode's env is done."""

    def observation_message(self, observation: str) -> ChatMessage:
        """The chat message that shows `observation` to the agent (override for a `tool` role)."""
        return {"role": "user", "content": observation}

    def tools(self) -> list[ToolSpec]:
        """The tools this env offers (its `@tool` methods); empty for a plain text env."""
        return [spec for spec, _ in tool_methods(self).values()]

    async def call_tool(self, call: ToolCall) -> ToolResult:
        """Run one parsed call. Malformed calls come back as an error result with the penalty.

        Never raises for the model's mistakes (unreadable call, unknown tool, arguments that do
        not match the schema, a `ToolError` from the tool): the model gets a message saying
        what was wrong, `info["tool_error"]` holds it, and the reward is `tool_error_penalty`
        (a `ToolError` is the tool refusing a well-formed call, so it costs nothing). Other
        exceptions are the env's own bugs and propagate like one from `astep`.
        """
        methods = tool_methods(self)
        problem = call.error
        if problem is None and call.name not in methods:
            problem = f"unknown tool {call.name!r}; available: {', '.join(methods) or 'none'}"
        args: dict[str, Any] | None = None
        if problem is None:
            spec, method = methods[call.name]
            args, problem = decode_arguments(call)
            if args is not None:
                problems = validate_arguments(spec.parameters, args)
                problem = "; ".join(problems) if problems else None
        if problem is not None or args is None:
            info = {"tool_error": problem, "format_error": True}
            return ToolResult(f"Error: {problem}", self.tool_error_penalty, info=info)
        try:
            result = await method(**args)
        except ToolError as exc:
            return ToolResult(f"Error: {exc}", info={"tool_error": str(exc)})
        return result if isinstance(result, ToolResult) else ToolResult(str(result))

    def expert_action(self) -> str:
        """A scripted expert's action for the current state, for tests and warm-start data."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted expert")

    def reference_action(self, name: str) -> str:
        """The action reference policy `name` (a key of `reference_policies`) takes now.

        Override together with `reference_policies`; the base declares none. A reference may
        read the env's hidden state (an expert does) and should draw its randomness from a
        per-episode stream, so that a seed gives the same reference episode every time.
        """
        raise UnknownReferencePolicy(
            f"{type(self).__name__} has no reference policy {name!r} "
            f"(declared: {', '.join(self.reference_policies) or 'none'})"
        )

    # -- synchronous adapters -------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        return self._run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self._run_sync(self.astep(action))

    def call_tool_sync(self, call: ToolCall) -> ToolResult:
        """`call_tool` for synchronous loops (tests, scripts), like `step` is for `astep`."""
        return self._run_sync(self.call_tool(call))

    def close(self) -> None:
        if self._sync_loop is not None:
            self._sync_loop.run_until_complete(self.aclose())
            self._sync_loop.close()
            self._sync_loop = None

    def _run_sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on this env's private loop (kept, so loop-bound resources stay valid)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coroutine.close()
            raise AgentRLError(
                "Env.reset()/step() were called inside a running event loop; await env.areset()/astep()"
            )
        if self._sync_loop is None or self._sync_loop.is_closed():
            self._sync_loop = asyncio.new_event_loop()
        return self._sync_loop.run_until_complete(coroutine)
