"""`agentrl envs list`, `agentrl envs check`, `agentrl rollout`, run in-process with CliRunner."""

from __future__ import annotations

import gc
import sys

import pytest
from typer.testing import CliRunner

import agentrl
from agentrl import registry
from agentrl.cli import app

runner = CliRunner()


class Pick(agentrl.Env):
    """Pick the seed's lucky letter within three tries."""

    system_prompt = "Pick a letter from a to e."

    def __init__(self, tries: int = 3) -> None:
        self.tries = tries

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.letter, self.left = "abcde"[int(self.np_random.integers(5))], self.tries
        return "Which letter?", {}

    async def astep(self, action: str):
        self.left -= 1
        success = action.strip() == self.letter
        return ("Yes." if success else "No."), float(success), success, self.left == 0, {"success": success}

    def expert_action(self) -> str:
        return self.letter

    def sample_action(self) -> str:
        return "abcde"[int(self.np_random.integers(5))]


class Broken(Pick):
    async def astep(self, action: str):
        raise RuntimeError("simulator crashed")


@pytest.fixture(autouse=True)
def test_envs():
    registry.register("clitest/Pick-v0", Pick, description="pick a letter")
    registry.register("clitest/Broken-v0", Broken)
    yield
    registry.unregister("clitest/Pick-v0")
    registry.unregister("clitest/Broken-v0")


def test_envs_list_shows_ids_and_descriptions():
    result = runner.invoke(app, ["envs", "list"])
    assert result.exit_code == 0, result.output
    assert "clitest/Pick-v0" in result.output
    assert "pick a letter" in result.output


def test_envs_check_passes_a_good_env():
    result = runner.invoke(app, ["envs", "check", "clitest/Pick-v0", "--episodes", "3"])
    assert result.exit_code == 0, result.output
    assert "PASS gymnasium check_env" in result.output
    assert "PASS random rollout: 3 episodes" in result.output
    assert "PASS expert rollout: 3 episodes, success 100%" in result.output


def test_envs_check_fails_an_env_that_raises():
    result = runner.invoke(app, ["envs", "check", "clitest/Broken-v0"])
    assert result.exit_code == 1
    assert "FAIL gymnasium check_env: RuntimeError: simulator crashed" in result.output
    assert "error: RuntimeError: simulator crashed" in result.output


def test_rollout_prints_success_reward_and_throughput():
    thresholds = gc.get_threshold()
    args = ["rollout", "clitest/Pick-v0", "--policy", "expert", "-n", "12", "--group-size", "4"]
    result = runner.invoke(app, [*args, "--redundancy", "1", "--concurrency", "8"])
    assert result.exit_code == 0, result.output
    output = result.output
    assert "episodes (kept) │ 12" in output
    assert "success rate    │ 100.0%" in output
    assert "terminated=12, cancelled=3" in output
    for metric in ("mean reward", "episodes/s", "env-steps/s"):
        assert metric in output
    assert gc.get_threshold() == thresholds  # the command's GC setting does not leak


def test_rollout_passes_env_args_to_the_constructor():
    args = ["rollout", "clitest/Pick-v0", "--policy", "random", "-n", "5", "--env-arg", "tries=1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "mean turns      │ 1.0" in result.output


def test_unknown_env_id_exits_2_with_suggestions_and_no_traceback():
    result = runner.invoke(app, ["rollout", "clitest/Pik-v0"])
    assert result.exit_code == 2
    assert "Did you mean: clitest/Pick-v0" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["envs", "check", "clitest/Pik-v0"])
    assert result.exit_code == 2 and "clitest/Pick-v0" in result.output


def test_bad_policy_and_env_arg_are_clean_errors():
    result = runner.invoke(app, ["rollout", "clitest/Pick-v0", "--policy", "smart"])
    assert result.exit_code == 2
    assert "--policy must be 'random', 'expert' or a policy server URL" in result.output
    result = runner.invoke(app, ["rollout", "clitest/Pick-v0", "--env-arg", "tries"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_policy_url_without_the_client_module_is_a_clean_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "agentrl.rollout.client", None)  # makes the import fail
    result = runner.invoke(app, ["rollout", "clitest/Pick-v0", "--policy", "http://127.0.0.1:8000"])
    assert result.exit_code == 2
    assert "agentrl.rollout.client" in result.output


def test_policy_url_needs_the_served_models_tokenizer():
    result = runner.invoke(app, ["rollout", "clitest/Pick-v0", "--policy", "http://127.0.0.1:8000"])
    assert result.exit_code == 2
    assert "--tokenizer MODEL_DIR" in result.output
