"""Reference policies: the env declares them, evaluation plays them on the model's seeds."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

import agentrl
from agentrl import Env
from agentrl.errors import UnknownReferencePolicy
from agentrl.registry import unregister
from agentrl.rollout.evaluate import evaluate_references, reference_names


class Coin(Env):
    """One turn: say the seed's parity. The references know it, ignore it, or always say "even"."""

    reference_policies: ClassVar[dict[str, str]] = {
        "oracle": "reads the answer off the hidden state",
        "even": "always says even, ignoring the observation",
    }

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.parity = "even" if seed % 2 == 0 else "odd"
        return "Parity?", {}

    async def astep(self, action):
        success = action == self.parity
        return "done", float(success), True, False, {"success": success}

    def reference_action(self, name: str) -> str:
        if name == "oracle":
            return self.parity
        if name == "even":
            return "even"
        return super().reference_action(name)


@pytest.fixture
def coin_id():
    agentrl.register("test/Coin-v0", Coin)
    yield "test/Coin-v0"
    unregister("test/Coin-v0")


def test_references_are_played_on_the_given_seeds(coin_id):
    assert list(reference_names(coin_id)) == ["oracle", "even"]
    # seeds 10..13: two even, two odd
    reports = asyncio.run(evaluate_references(coin_id, 4, seed_offset=10))
    assert {name: r.success_rate for name, r in reports.items()} == {"oracle": 1.0, "even": 0.5}
    assert all(r.seed_offset == 10 and r.episodes == 4 and r.errors == 0 for r in reports.values())


def test_an_env_without_references_has_none(coin_id):
    agentrl.register("test/Plain-v0", Env)
    try:
        assert reference_names("test/Plain-v0") == {}
        assert asyncio.run(evaluate_references("test/Plain-v0", 4)) == {}
    finally:
        unregister("test/Plain-v0")


def test_an_undeclared_reference_is_a_clear_error():
    env = Coin()
    with pytest.raises(UnknownReferencePolicy, match="oracle, even"):
        Env.reference_action(env, "expert")
