"""The shop's graded reward on hand-checked purchases."""

from __future__ import annotations

import pytest
from agentrl_web.shop.catalog import OrderItem, Product, Task, build_catalogue, item_reward, order_reward

TASK = Task(category="shirt", material="cotton", color="blue", size="M", max_price=30.0, source_pid=1)


def product(**changes) -> Product:
    fields = dict(
        pid=1,
        brand="Oakline",
        category="shirt",
        department="tops",
        material="cotton",
        style="classic",
        colors=("blue", "red"),
        sizes=("S", "M"),
        price=24.0,
    )
    return Product(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "options", "expected"),
    [
        ({}, {"color": "blue", "size": "M"}, 1.0),  # the exact item
        ({}, {"color": "red", "size": "M"}, 0.75),  # wrong color
        ({}, {"color": "red", "size": "S"}, 0.5),  # wrong color and size
        ({"price": 31.0}, {"color": "blue", "size": "M"}, 0.75),  # over budget
        ({"material": "linen"}, {"color": "blue", "size": "M"}, 0.75),  # wrong material
        ({"category": "sweater"}, {"color": "blue", "size": "M"}, 0.5),  # same department, other category
        (
            {"category": "jeans", "department": "bottoms"},
            {"color": "blue", "size": "M"},
            0.0,
        ),  # other department
        ({"price": 30.0}, {"color": "blue", "size": "M"}, 1.0),  # at the budget is within it
    ],
)
def test_item_reward_matches_hand_computed_values(changes, options, expected):
    assert item_reward(TASK, product(**changes), options) == pytest.approx(expected)


def test_order_reward_is_the_mean_over_items_and_zero_for_no_order():
    catalogue = build_catalogue(0)
    task = catalogue.sample_task(__import__("numpy").random.default_rng(3))
    exact = catalogue.by_pid[task.source_pid]
    good = OrderItem(exact.pid, {"color": task.color, "size": task.size}, exact.price)
    assert order_reward(task, catalogue, [good]) == 1.0
    assert order_reward(task, catalogue, []) == 0.0
    other = next(p for p in catalogue.products if p.department != exact.department)
    bad = OrderItem(other.pid, {"color": other.colors[0], "size": other.sizes[0]}, other.price)
    assert order_reward(task, catalogue, [good, bad]) == 0.5


def test_catalogue_and_tasks_are_deterministic_and_satisfiable():
    import numpy as np

    a, b = build_catalogue(7), build_catalogue.__wrapped__(7)
    assert a.products == b.products
    for seed in range(50):
        task = a.sample_task(np.random.default_rng(seed))
        assert task.satisfied_by(a.by_pid[task.source_pid])
        assert task.instruction.startswith(f"Buy a {task.color} {task.material} {task.category}")
