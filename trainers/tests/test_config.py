"""The training config: defaults make a tiny YAML work; mistakes name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentrl_trainers.config import TrainConfig, load_config

from agentrl.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_minimal_yaml_fills_every_section_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("env: {id: games/FrozenLake-v0}\n")
    config = load_config(path)
    assert config.env.id == "games/FrozenLake-v0"
    assert config.env.group_size == TrainConfig().env.group_size
    assert config.schedule.steps >= 1


def test_unknown_field_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  group_sise: 4\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "env.group_sise" in message
    assert "Did you mean 'group_size'?" in message
    assert "max_turns" in message  # the allowed fields are listed


def test_wrong_literal_value_lists_the_allowed_values(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("mode: asynchronous\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "mode" in message and "'sync'" in message and "'async'" in message


def test_out_of_range_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"buffer\.max_staleness"):
        load_config(None, {"buffer.max_staleness": -1})


def test_eval_seeds_must_be_held_out() -> None:
    with pytest.raises(ConfigError, match="eval_seed_offset"):
        load_config(None, {"schedule.eval_seed_offset": 10, "schedule.steps": 50})


def test_sync_mode_means_zero_staleness() -> None:
    config = load_config(None, {"mode": "sync", "buffer.max_staleness": 3})
    assert config.effective_max_staleness == 0
    assert load_config(None, {"mode": "async", "buffer.max_staleness": 3}).effective_max_staleness == 3


def test_rollout_tail_batching_needs_synchronous_batch_rollout() -> None:
    sync_batch = {"mode": "sync", "env.rollout": "batch", "env.speculative_groups": 2}
    assert load_config(None, sync_batch).env.speculative_groups == 2
    with pytest.raises(ConfigError, match="speculative_groups"):
        load_config(None, sync_batch | {"mode": "async"})
    with pytest.raises(ConfigError, match="speculative_groups"):
        load_config(None, sync_batch | {"env.rollout": "async"})
    assert load_config(None, sync_batch | {"env.rollout": "rounds"}).env.rollout == "rounds"


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_are_valid(example: Path) -> None:
    load_config(example)


def test_shipped_examples_include_the_main_job() -> None:
    assert (EXAMPLES / "guess_number.yaml") in EXAMPLES.glob("*.yaml")


def test_turn_state_key_defaults_to_history_and_is_checked() -> None:
    assert load_config(None).learner.turn_state == "history"
    assert load_config(None, {"learner.turn_state": "observation"}).learner.turn_state == "observation"
    with pytest.raises(ConfigError, match=r"learner\.turn_state.*'history'.*'observation'"):
        load_config(None, {"learner.turn_state": "last_observation"})


def test_server_gets_half_the_cores_and_the_trainer_all_of_them() -> None:
    for mode in ("sync", "async"):
        config = load_config(None, {"mode": mode})
        assert config.cpu_threads(8) == (4, 8)
        assert config.cpu_threads(2) == (1, 2)
        assert config.cpu_threads(1) == (1, 1)
    pinned = load_config(None, {"mode": "async", "server.threads": 3})
    assert pinned.cpu_threads(8) == (3, 8)
