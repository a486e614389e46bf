"""Registry: register/make/list, errors with suggestions, `module:Name-vN`, entry-point discovery."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl import EnvLoadError, RegistrationError, UnknownEnvError, registry

FIXTURE = Path(__file__).parent / "fixtures" / "thirdparty_env"
EXAMPLE = Path(__file__).parents[1] / "examples" / "custom_env"
THIRDPARTY_MODULE = "agentrl_thirdparty_echo"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"], check=True)


@pytest.fixture(scope="session")
def thirdparty_installed(tmp_path_factory: pytest.TempPathFactory):
    """pip-install the fixture suite (a copy, so no build files land in the repo); uninstall after."""
    source = tmp_path_factory.mktemp("thirdparty") / "pkg"
    shutil.copytree(FIXTURE, source)
    _pip("install", "--no-deps", "--no-build-isolation", str(source))
    importlib.invalidate_caches()
    yield
    _pip("uninstall", "--yes", "agentrl-thirdparty-echo")
    sys.modules.pop(THIRDPARTY_MODULE, None)
    registry.unregister("thirdparty/Echo-v0")


class Counter(agentrl.Env):
    def __init__(self, start: int = 0, step_size: int = 1) -> None:
        self.start, self.step_size = start, step_size

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed, options=options)
        self.value = self.start
        return str(self.value), {}

    async def astep(self, action: str):
        self.value += self.step_size
        return str(self.value), 0.0, self.value >= 10, False, {}


@pytest.fixture
def registered():
    ids = ["test/Counter-v0", "test/Counter-v1"]
    agentrl.register(ids[0], Counter, description="counts up", start=3)
    yield ids
    for env_id in ids:
        registry.unregister(env_id)


def test_register_make_and_list(registered):
    env = agentrl.make("test/Counter-v0")
    assert isinstance(env, Counter) and (env.start, env.step_size) == (3, 1)
    env = agentrl.make("test/Counter-v0", step_size=4)  # make kwargs override registered defaults
    assert (env.start, env.step_size) == (3, 4)
    assert "test/Counter-v0" in agentrl.list_envs()
    assert agentrl.spec("test/Counter-v0").description == "counts up"


def test_registering_an_id_twice_is_an_error_unless_overriding(registered):
    with pytest.raises(RegistrationError, match="already registered; pass override=True"):
        agentrl.register("test/Counter-v0", Counter)
    agentrl.register("test/Counter-v0", Counter, override=True, start=7)
    assert agentrl.make("test/Counter-v0").start == 7


@pytest.mark.parametrize("bad_id", ["Counter", "test/Counter", "test/Counter-vX", "a b/C-v0"])
def test_malformed_ids_are_rejected(bad_id):
    with pytest.raises(RegistrationError, match="namespace/Name-vN"):
        agentrl.register(bad_id, Counter)


def test_unknown_ids_suggest_close_matches(registered):
    with pytest.raises(UnknownEnvError) as error:
        agentrl.make("test/Countr-v0")
    assert "test/Counter-v0" in error.value.suggestions
    assert "Did you mean: test/Counter-v0" in str(error.value)
    with pytest.raises(UnknownEnvError, match="agentrl envs list"):
        agentrl.make("zzz/Qqqqqq-v9")


def test_a_factory_that_returns_no_env_is_a_load_error(registered):
    agentrl.register("test/Counter-v1", lambda: object())
    with pytest.raises(EnvLoadError, match=r"not an agentrl\.Env"):
        agentrl.make("test/Counter-v1")


def test_string_entry_points_are_imported_on_make(registered):
    agentrl.register("test/Counter-v1", "test_registry:Counter", start=2)
    assert agentrl.make("test/Counter-v1").start == 2
    agentrl.register("test/Counter-v1", "test_registry:Nope", override=True)
    with pytest.raises(EnvLoadError, match="no attribute 'Nope'"):
        agentrl.make("test/Counter-v1")


def test_module_colon_id_imports_the_module_that_registers(tmp_path, monkeypatch):
    module = tmp_path / "my_private_suite.py"
    module.write_text(
        textwrap.dedent(
            """
            import agentrl
            from test_registry import Counter
            agentrl.register("private/Counter-v0", Counter, start=5)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = agentrl.make("my_private_suite:private/Counter-v0")
        assert isinstance(env, Counter) and env.start == 5
        with pytest.raises(UnknownEnvError):
            agentrl.make("my_private_suite:private/Missing-v0")
        with pytest.raises(EnvLoadError, match="Could not import 'no_such_module_xyz'"):
            agentrl.make("no_such_module_xyz:private/Counter-v0")
    finally:
        registry.unregister("private/Counter-v0")
        sys.modules.pop("my_private_suite", None)


def test_a_pip_installed_suite_is_listed_lazily_and_made_through_its_entry_point(thirdparty_installed):
    sys.modules.pop(THIRDPARTY_MODULE, None)
    assert "thirdparty/Echo-v0" in agentrl.list_envs()
    assert THIRDPARTY_MODULE not in sys.modules  # listing read metadata only
    env = agentrl.make("thirdparty/Echo-v0")
    assert THIRDPARTY_MODULE in sys.modules
    assert type(env).__module__ == THIRDPARTY_MODULE
    word, _ = env.reset(seed=0)
    assert env.step(word)[1:4] == (1.0, True, False)
    check_env(env, skip_render_check=True)
    env.close()


def test_the_example_package_passes_the_gymnasium_checker(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from agentrl_example_guess import GuessNumberEnv

    env = GuessNumberEnv(high=50)
    check_env(env, skip_render_check=True)
    env.reset(seed=1)
    for _ in range(7):  # binary search over 50 numbers needs at most 6 guesses
        _, reward, terminated, _, info = env.step(env.expert_action())
        if terminated:
            break
    assert info["success"] and reward == 1.0
    sys.modules.pop("agentrl_example_guess", None)
