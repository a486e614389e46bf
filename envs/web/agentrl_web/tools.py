"""The web envs with tools: `search`, `click`, `type`, `back` and `answer` as OpenAI-style tools.

`web/ShopTools-v0` and `web/WikiTools-v0` are the same sites and tasks as `web/Shop-v0` and
`web/Wiki-v0`; the agent acts by calling tools instead of writing `click[3]`. Each call is one
turn of the episode (counted against `max_turns`, graded after it, the new page is the tool's
result). A call the site cannot apply (no such element, no search box) is answered with the
error and the env's `format_penalty`, exactly like a bad text action; a call that does not match
the schema costs `tool_error_penalty` (the same 0.1 by default). Text actions still work, so an
episode may mix both.
"""

from __future__ import annotations

from typing import Any

from agentrl_web.actions import Action, parse_action
from agentrl_web.shop_env import ShopEnv
from agentrl_web.web_env import WebEnv
from agentrl_web.wiki_env import WikiEnv

from agentrl.tools import ToolResult, format_call, tool

_TOOL_USAGE = "Act by calling one tool per turn: search, click, type, back, or answer."


class BrowserTools(WebEnv):
    """The browser actions as tools, for any `WebEnv` site (mixed in before the site's class)."""

    tool_error_penalty = -0.1

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.system_prompt = (
            f"You browse a website to complete a task. {self.task_description} Each tool result "
            f"shows the page with numbered elements. {_TOOL_USAGE}"
        )

    @tool
    async def search(self, query: str) -> ToolResult:
        """Type a query into the page's search box and submit it."""
        return await self._tool_turn(Action("search", text=query))

    @tool
    async def click(self, element: int) -> ToolResult:
        """Follow a link or press a button, by its [id] on the page."""
        return await self._tool_turn(Action("click", element))

    @tool(name="type")
    async def type_text(self, element: int, text: str) -> ToolResult:
        """Type text into the input with this [id] and submit its form."""
        return await self._tool_turn(Action("type", element, text))

    @tool
    async def back(self) -> ToolResult:
        """Return to the previous page."""
        return await self._tool_turn(Action("back"))

    @tool
    async def answer(self, text: str) -> ToolResult:
        """Give the final answer (sites that ask a question); ends the episode."""
        return await self._tool_turn(Action("answer", text=text))

    async def _tool_turn(self, action: Action) -> ToolResult:
        observation, reward, terminated, truncated, info = await self.act(lambda: action)
        return ToolResult(observation, reward, terminated, truncated, info)

    def expert_action(self) -> str:
        """The site's expert move, written as a tool call."""
        move = parse_action(super().expert_action())
        arguments: dict[str, Any] = {
            "search": {"query": move.text},
            "click": {"element": move.target},
            "type": {"element": move.target, "text": move.text},
            "back": {},
            "answer": {"text": move.text},
        }[move.kind]
        return format_call(move.kind, arguments)


class ShopToolEnv(BrowserTools, ShopEnv):
    """`web/ShopTools-v0`."""


class WikiToolEnv(BrowserTools, WikiEnv):
    """`web/WikiTools-v0`."""
