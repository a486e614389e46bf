"""`web/Shop-v0`: buy the product that an instruction describes, graded by attribute match.

The episode ends when an order is placed (checkout) or after `max_turns`. The reward is the
graded match of the order (`agentrl_web.shop.catalog.order_reward`, formula there and in the
README); `info["success"]` is True for a reward of exactly 1.0.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl_web.browser import fetch
from agentrl_web.render import Element
from agentrl_web.shop.catalog import OrderItem, Task, build_catalogue, order_reward
from agentrl_web.web_env import WebEnv

_PRODUCT = re.compile(r"/product/(\d+)$")


class ShopEnv(WebEnv):
    app = "shop"
    task_description = (
        "Find the product the task describes, choose its options, add it to the cart and check "
        "out; the purchase is graded on category, material, color, size and price."
    )

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 20)
        super().__init__(**kwargs)
        self.catalogue = build_catalogue(self.world_seed)
        self.task: Task | None = None

    def _sample_task(self) -> None:
        self.task = self.catalogue.sample_task(self.np_random)

    @property
    def instruction(self) -> str:
        return self.task.instruction if self.task else ""

    async def _evaluate(self) -> tuple[bool, float, bool]:
        if not self.page_path().startswith("/order"):
            return False, 0.0, False
        response = await fetch("GET", f"{self.base_url}/api/sessions/{self.session}/order")
        data = response.json() if response.status_code == 200 else {}
        if not data.get("placed"):
            return False, 0.0, False
        assert self.task is not None
        items = [OrderItem(i["pid"], i["options"], i["price"]) for i in data["items"]]
        reward = order_reward(self.task, self.catalogue, items)
        return True, reward, reward == 1.0

    def expert_action(self) -> str:
        """Search for the task's words, open a product that satisfies it, pick options, buy."""
        task, page, path = self.task, self.page, self.page_path()
        assert task is not None
        if path.startswith("/search"):
            for element in page.elements:
                match = _PRODUCT.search(element.href) if element.kind == "link" else None
                if match and task.satisfied_by(self.catalogue.by_pid[int(match.group(1))]):
                    return f"click[{element.id}]"
            next_page = _find(page.elements, "link", "Next >")
            if next_page is not None:
                return f"click[{next_page.id}]"
        elif (match := _PRODUCT.search(path)) and task.satisfied_by(
            self.catalogue.by_pid[int(match.group(1))]
        ):
            for name, value in (("color", task.color), ("size", task.size)):
                option = next(
                    (
                        e
                        for e in page.elements
                        if e.kind == "button" and e.form is not None and e.form.fields.get(name) == value
                    ),
                    None,
                )
                if option is not None and not option.text.endswith("(selected)"):
                    return f"click[{option.id}]"
            add = _find(page.elements, "button", "Add to cart")
            if add is not None:
                return f"click[{add.id}]"
        elif path.startswith("/cart"):
            checkout = _find(page.elements, "button", "Checkout")
            if checkout is not None and "cart is empty" not in page.text:
                return f"click[{checkout.id}]"
        return (
            f"search[{task.color} {task.material} {task.category}]" if _has_search(page.elements) else "back"
        )


def _find(elements: list[Element], kind: str, text: str) -> Element | None:
    return next((e for e in elements if e.kind == kind and e.text == text), None)


def _has_search(elements: list[Element]) -> bool:
    return any(e.kind == "input" for e in elements)
