"""The shared logic of the web envs: sessions, the action loop, observations, format penalties.

A subclass names its app, draws a task, says where an episode starts and how the current page
is graded (`_evaluate`), and may accept `answer[...]` (`_on_answer`). Everything else (parsing,
rendering, penalties, the turn limit, the scripted-expert hook) lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from typing import Any, ClassVar

import httpx
from agentrl_web.actions import USAGE, Action, ActionError, parse_action
from agentrl_web.browser import Browser, fetch
from agentrl_web.render import Page
from agentrl_web.server import WebServerError, shared_server

from agentrl.core import Env

_SESSION_PREFIX = re.compile(r"^https?://[^/]+/s/[^/]+")
_RANDOM_WORDS = [
    "blue",
    "shirt",
    "cotton",
    "red",
    "boots",
    "river",
    "city",
    "founder",
    "company",
    "size",
    "cheap",
]


class WebEnv(Env):
    """Browse one app through per-episode sessions; subclasses define tasks and grading."""

    app: ClassVar[str]
    task_description: ClassVar[str] = ""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        world_seed: int = 0,
        max_turns: int = 20,
        format_penalty: float = 0.1,
        max_observation_chars: int = 8000,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.base_url = base_url.rstrip("/") if base_url else None
        self.world_seed = world_seed
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.max_observation_chars = max_observation_chars
        self.system_prompt = (
            f"You browse a website to complete a task. {self.task_description} Each observation shows "
            f"the page with numbered elements. Reply with exactly one action: {USAGE}, optionally inside "
            "<answer>...</answer>."
        )
        self.browser = Browser()
        self.session: str | None = None
        self.turn = 0
        self.done = False

    # -- hooks for subclasses ---------------------------------------------------------------

    def _sample_task(self) -> None:
        """Draw `self.task` from `self.np_random` (already seeded)."""
        raise NotImplementedError

    def _start_path(self) -> str:
        """The in-session path where an episode starts, e.g. `/` or `/wiki/slug`."""
        return "/"

    @property
    def instruction(self) -> str:
        raise NotImplementedError

    async def _evaluate(self) -> tuple[bool, float, bool]:
        """After each action: `(terminated, reward, success)` for the page now shown."""
        return False, 0.0, False

    async def _on_answer(self, text: str) -> tuple[float, bool]:
        """`answer[text]` ends the episode with `(reward, success)`; sites without answers refuse it."""
        raise ActionError("This site takes no answer[...] action")

    # -- the episode ------------------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)
        if self.base_url is None:
            self.base_url = await asyncio.to_thread(shared_server, self.app, self.world_seed)
            self._server_checked = True
        if not self._server_checked:
            await self._check_server()
        await self._end_session()
        response = await fetch("POST", f"{self.base_url}/api/sessions")
        response.raise_for_status()
        self.session = response.json()["session"]
        self._sample_task()
        self.turn, self.done = 0, False
        self.browser = Browser()
        await self.browser.goto(self.session_url(self._start_path()))
        return self._observation(), {"task": self.instruction}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return await self.act(lambda: parse_action(action))

    async def act(self, read: Callable[[], Action]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn: `read()` gives the action (or raises `ActionError`: a format penalty).

        Shared by text actions (`astep` parses them) and the tool variants (`agentrl_web.tools`),
        so both count turns, penalise and grade the same way.
        """
        if self.session is None:
            raise RuntimeError("Call areset() before astep()")
        if self.done:
            return self._observation(), 0.0, True, False, {"success": self._success}
        self.turn += 1
        info: dict[str, Any] = {"format_error": False}
        try:
            reward, terminated, success = await self._apply(read())
        except ActionError as exc:
            info.update(format_error=True, error=str(exc))
            reward, terminated, success = -self.format_penalty, False, False
        truncated = not terminated and self.turn >= self.max_turns
        self.done = terminated or truncated
        self._success = success
        info["success"] = success
        return self._observation(info.get("error")), reward, terminated, truncated, info

    async def _apply(self, action: Action) -> tuple[float, bool, bool]:
        page = self.page
        if action.kind == "answer":
            reward, success = await self._on_answer(action.text)
            return reward, True, success
        if action.kind == "back":
            if await self.browser.back() is None:
                raise ActionError("There is no previous page to go back to")
        elif action.kind == "search":
            box = next((e for e in page.elements if e.kind == "input" and e.form is not None), None)
            if box is None or box.form is None:
                raise ActionError("This page has no search box")
            await self.browser.submit(box.form, {box.name: action.text})
        else:
            element = page.element(action.target or 0)
            if element is None:
                raise ActionError(f"No element [{action.target}] on this page (ids 1-{len(page.elements)})")
            if action.kind == "click":
                if element.kind == "link":
                    await self.browser.goto(element.href)
                elif element.kind == "button" and element.form is not None:
                    await self.browser.submit(
                        element.form, {element.name: element.value} if element.name else {}
                    )
                else:
                    raise ActionError(f"[{element.id}] is an {element.kind}; use type[{element.id}][text]")
            else:  # type
                if element.kind != "input" or element.form is None:
                    raise ActionError(f"[{element.id}] is not a text input")
                await self.browser.submit(element.form, {element.name: action.text})
        terminated, reward, success = await self._evaluate()
        return reward, terminated, success

    async def aclose(self) -> None:
        await self._end_session()

    async def _check_server(self) -> None:
        """A server given by `base_url` must serve this app built from this env's seed: the env
        draws tasks from its own copy of the generated data, and a mismatch would grade nonsense."""
        response = await fetch("GET", f"{self.base_url}/api/info")
        info = response.json() if response.status_code == 200 else {}
        if info.get("app") != self.app or info.get("seed") != self.world_seed:
            raise WebServerError(
                f"{self.base_url} serves app={info.get('app')!r} seed={info.get('seed')!r}; this env needs "
                f"app={self.app!r} seed={self.world_seed} (python -m agentrl_web.serve {self.app} "
                f"--seed {self.world_seed})"
            )
        self._server_checked = True

    async def _end_session(self) -> None:
        """Free the server-side session now rather than waiting for it to expire."""
        if self.session is not None and self.base_url is not None:
            session, self.session = self.session, None
            with contextlib.suppress(httpx.HTTPError):  # if this fails the server expires it anyway
                await fetch("DELETE", f"{self.base_url}/api/sessions/{session}")

    # -- views of the state -----------------------------------------------------------------

    _success = False
    _server_checked = False

    @property
    def page(self) -> Page:
        if self.browser.page is None:
            raise RuntimeError("No page loaded; call areset() first")
        return self.browser.page

    def session_url(self, path: str) -> str:
        return f"{self.base_url}/s/{self.session}{path}"

    def page_path(self) -> str:
        """The current URL without origin and session prefix, e.g. `/search?q=shirt`."""
        return _SESSION_PREFIX.sub("", self.page.url) or "/"

    def _observation(self, error: str | None = None) -> str:
        page = self.page
        body = page.text
        if len(body) > self.max_observation_chars:
            body = body[: self.max_observation_chars] + "\n... (page truncated)"
        head = f"Task: {self.instruction}\nTurn {self.turn}/{self.max_turns}. "
        head += f"Page: {page.title} ({self.page_path()})"
        if page.status >= 400:
            head += f" [HTTP {page.status}]"
        note = f"\nInvalid action: {error}" if error else ""
        return f"{head}\n{body}{note}"

    def sample_action(self) -> str:
        """A plausible random action: mostly clicks on listed elements, sometimes search/back."""
        rng = self.np_random
        elements = self.page.elements
        roll = float(rng.random())
        if roll < 0.1 or not elements:
            return "back"
        if roll < 0.25:
            words = rng.choice(_RANDOM_WORDS, size=2, replace=False)
            return f"search[{' '.join(words)}]"
        return f"click[{int(rng.integers(1, len(elements) + 1))}]"
