"""`web/Wiki-v0`: navigate between articles or answer a question on a generated knowledge site.

`task_kind` picks the tasks: "navigate" (reach the target article by following links; reward
1.0 on arrival, which ends the episode), "question" (answer[...] ends the episode; 1.0 for the
right answer, else 0.0) or "mixed" (either, half and half, by seed).
"""

from __future__ import annotations

import re
from typing import Any

from agentrl_web.actions import ActionError
from agentrl_web.web_env import WebEnv
from agentrl_web.wiki.world import Task, build_world, normalize_answer

_ARTICLE = re.compile(r"^/wiki/([^/?#]+)")


class WikiEnv(WebEnv):
    app = "wiki"
    task_description = (
        "Reach the article the task names by following links, or find the answer to the "
        "task's question and reply answer[your answer]."
    )

    def __init__(self, *, task_kind: str = "mixed", **kwargs: Any) -> None:
        if task_kind not in ("mixed", "navigate", "question"):
            raise ValueError(f"task_kind must be 'mixed', 'navigate' or 'question', not {task_kind!r}")
        kwargs.setdefault("max_turns", 15)
        super().__init__(**kwargs)
        self.task_kind = task_kind
        self.world = build_world(self.world_seed)
        self.task: Task | None = None

    def _sample_task(self) -> None:
        self.task = self.world.sample_task(self.np_random, self.task_kind)

    def _start_path(self) -> str:
        assert self.task is not None
        return f"/wiki/{self.task.start}" if self.task.start else "/"

    @property
    def instruction(self) -> str:
        return self.task.instruction if self.task else ""

    def current_article(self) -> str | None:
        match = _ARTICLE.match(self.page_path())
        return match.group(1) if match and self.page.status == 200 else None

    async def _evaluate(self) -> tuple[bool, float, bool]:
        assert self.task is not None
        if self.task.kind == "navigate" and self.current_article() == self.task.target:
            return True, 1.0, True
        return False, 0.0, False

    async def _on_answer(self, text: str) -> tuple[float, bool]:
        assert self.task is not None
        if self.task.kind != "question":
            raise ActionError("This is a navigation task: reach the target article instead of answering")
        correct = normalize_answer(text) == normalize_answer(self.task.answer)
        return float(correct), correct

    def expert_action(self) -> str:
        """Search for the subject from the home page, then follow the BFS path to the target."""
        task, page = self.task, self.page
        assert task is not None
        here = self.current_article()
        if here == task.target and task.kind == "question":
            return f"answer[{task.answer}]"
        if here is not None:
            route = self.world.path(here, task.target)
            if route is not None and len(route) > 1:
                for element in page.elements:
                    if element.kind == "link" and element.href.endswith(f"/wiki/{route[1]}"):
                        return f"click[{element.id}]"
        if self.page_path().startswith("/search"):
            # from search results, open the subject (question) or the target (navigation) if listed
            for element in page.elements:
                if element.kind == "link" and element.href.endswith(f"/wiki/{task.subject}"):
                    return f"click[{element.id}]"
        if any(e.kind == "input" for e in page.elements):
            return f"search[{self.world.articles[task.subject].title}]"
        home = next((e for e in page.elements if e.kind == "link" and e.text == "Home"), None)
        return f"click[{home.id}]" if home else "back"
