"""The shop's catalogue and tasks, generated from seeds, and the graded purchase reward.

The catalogue depends only on `catalogue_seed`, so a server and the envs that browse it (in the
same process or not) build identical catalogues. A task is drawn from one real product, so
every task has at least one product that satisfies it exactly.

Reward of one purchased item, in the spirit of WebShop (Yao et al., 2022):

    reward = r_type * (material_ok + color_ok + size_ok + price_ok) / 4
    r_type = 1.0 same category, 0.5 same department (e.g. shirt vs. sweater), 0.0 otherwise

An order's reward is the mean over its items (buying extra items dilutes it); no order -> 0.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np

DEPARTMENTS: dict[str, dict[str, list[str]]] = {
    "tops": {
        "categories": ["shirt", "t-shirt", "sweater", "hoodie", "jacket"],
        "materials": ["cotton", "linen", "wool", "polyester", "silk"],
        "sizes": ["XS", "S", "M", "L", "XL"],
    },
    "bottoms": {
        "categories": ["jeans", "shorts", "skirt", "trousers"],
        "materials": ["denim", "cotton", "linen", "polyester"],
        "sizes": ["28", "30", "32", "34", "36"],
    },
    "footwear": {
        "categories": ["sneakers", "boots", "sandals"],
        "materials": ["leather", "canvas", "suede", "mesh"],
        "sizes": ["6", "7", "8", "9", "10", "11", "12"],
    },
}
COLORS = ["black", "white", "blue", "red", "green", "grey", "navy", "beige", "brown", "pink", "yellow"]
BASE_PRICE = {
    "shirt": 25,
    "t-shirt": 14,
    "sweater": 40,
    "hoodie": 35,
    "jacket": 70,
    "jeans": 45,
    "shorts": 22,
    "skirt": 30,
    "trousers": 38,
    "sneakers": 55,
    "boots": 90,
    "sandals": 28,
}
STYLES = ["classic", "slim fit", "relaxed", "vintage", "everyday", "premium", "lightweight", "sport"]
_BRAND_PARTS = (
    ["north", "blue", "oak", "river", "stone", "sun", "pine", "iron", "silver", "maple"],
    ["wind", "field", "crest", "line", "craft", "wear", "peak", "harbor", "lane", "works"],
)

_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> set[str]:
    """Lower-case alphanumeric words: what search matches on."""
    return set(_TOKEN.findall(text.lower()))


@dataclass(frozen=True)
class Product:
    pid: int
    brand: str
    category: str
    department: str
    material: str
    style: str
    colors: tuple[str, ...]
    sizes: tuple[str, ...]
    price: float

    @property
    def title(self) -> str:
        return f"{self.brand} {self.style} {self.material} {self.category}"

    @property
    def options(self) -> dict[str, tuple[str, ...]]:
        return {"color": self.colors, "size": self.sizes}

    @functools.cached_property
    def search_tokens(self) -> frozenset[str]:
        return frozenset(tokens(" ".join([self.title, self.department, *self.colors])))


@dataclass(frozen=True)
class Task:
    """Buy one `category` made of `material`, in `color` and `size`, costing at most `max_price`."""

    category: str
    material: str
    color: str
    size: str
    max_price: float
    source_pid: int  # the product the task was drawn from (one exact solution among possibly many)

    @property
    def instruction(self) -> str:
        return (
            f"Buy a {self.color} {self.material} {self.category} in size {self.size}, "
            f"priced at most ${self.max_price:.2f}."
        )

    def satisfied_by(self, product: Product) -> bool:
        """Whether some choice of options on `product` scores 1.0."""
        return (
            product.category == self.category
            and product.material == self.material
            and self.color in product.colors
            and self.size in product.sizes
            and product.price <= self.max_price
        )


@dataclass(frozen=True)
class OrderItem:
    pid: int
    options: dict[str, str]
    price: float


class Catalogue:
    """All products of one seed, with the search the shop app runs."""

    def __init__(self, products: list[Product], seed: int) -> None:
        self.products = products
        self.seed = seed
        self.by_pid = {p.pid: p for p in products}

    def search(self, query: str) -> list[Product]:
        """Products matching at least one query word, best first (words matched, then pid)."""
        words = tokens(query)
        scored = [(len(words & p.search_tokens), p) for p in self.products]
        return [p for score, p in sorted(scored, key=lambda s: (-s[0], s[1].pid)) if score > 0]

    def sample_task(self, rng: np.random.Generator) -> Task:
        product = self.products[int(rng.integers(len(self.products)))]
        budget = math.ceil(product.price * float(rng.uniform(1.05, 1.5)))
        return Task(
            category=product.category,
            material=product.material,
            color=product.colors[int(rng.integers(len(product.colors)))],
            size=product.sizes[int(rng.integers(len(product.sizes)))],
            max_price=float(budget),
            source_pid=product.pid,
        )


@functools.lru_cache(maxsize=8)
def build_catalogue(seed: int = 0, size: int = 600) -> Catalogue:
    """Generate `size` products deterministically from `seed`."""
    rng = np.random.default_rng(seed)
    brands = [a.title() + b for a in _BRAND_PARTS[0] for b in _BRAND_PARTS[1]]
    products = []
    for pid in range(1, size + 1):
        department = list(DEPARTMENTS)[int(rng.integers(len(DEPARTMENTS)))]
        spec = DEPARTMENTS[department]
        category = spec["categories"][int(rng.integers(len(spec["categories"])))]
        n_colors = int(rng.integers(2, 5))
        n_sizes = int(rng.integers(3, len(spec["sizes"]) + 1))
        colors = tuple(sorted(rng.choice(COLORS, size=n_colors, replace=False).tolist()))
        size_idx = sorted(rng.choice(len(spec["sizes"]), size=n_sizes, replace=False).tolist())
        price = round(BASE_PRICE[category] * float(rng.uniform(0.6, 1.8)), 2)
        products.append(
            Product(
                pid=pid,
                brand=brands[int(rng.integers(len(brands)))],
                category=category,
                department=department,
                material=spec["materials"][int(rng.integers(len(spec["materials"])))],
                style=STYLES[int(rng.integers(len(STYLES)))],
                colors=colors,
                sizes=tuple(spec["sizes"][i] for i in size_idx),
                price=price,
            )
        )
    return Catalogue(products, seed)


def item_reward(task: Task, product: Product, options: dict[str, str]) -> float:
    """The graded reward of buying `product` with `options` for `task` (formula in the module doc)."""
    if product.category == task.category:
        r_type = 1.0
    elif product.department == _department_of(task.category):
        r_type = 0.5
    else:
        return 0.0
    matched = (
        (product.material == task.material)
        + (options.get("color") == task.color)
        + (options.get("size") == task.size)
        + (product.price <= task.max_price)
    )
    return r_type * matched / 4


def order_reward(task: Task, catalogue: Catalogue, items: list[OrderItem]) -> float:
    """Mean item reward over the order; an empty order earns nothing."""
    if not items:
        return 0.0
    return sum(item_reward(task, catalogue.by_pid[i.pid], i.options) for i in items) / len(items)


def _department_of(category: str) -> str:
    return next(d for d, spec in DEPARTMENTS.items() if category in spec["categories"])
