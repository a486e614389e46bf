"""The package layout's promises: a torch-free env side, and imports that point one way.

`agentrl` (env API, registry, rollout, serving, sandbox, CLI) never imports the trainers
distribution; the rollout side never imports the serving side or the other way round; the core
modules import only each other; and no two modules import each other, directly or in a ring.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"agentrl": ROOT / "agentrl", "agentrl_trainers": ROOT / "trainers" / "agentrl_trainers"}


def _module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Every module this file imports (absolute names), wherever the import statement sits."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule, not pkg
                submodule = f"{target}.{alias.name}"
                names.add(submodule if submodule in known else target)
    return names


def _graph() -> dict[str, set[str]]:
    modules = {
        _module_name(package, path): path for package, root in PACKAGES.items() for path in root.rglob("*.py")
    }
    known = set(modules)
    return {name: {m for m in _imports(path, name, known) if m in known} for name, path in modules.items()}


def _side(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "agentrl_trainers":
        return "trainers"
    if len(parts) == 1:
        return "facade"  # agentrl/__init__.py re-exports the public API
    return parts[1] if parts[1] in {"rollout", "serving", "sandbox", "cli", "viewer", "ray"} else "core"


# What each side may import (besides itself). The CLI composes everything in agentrl.
ALLOWED = {
    "core": {"core"},
    "facade": {"core", "rollout"},
    "rollout": {"core"},
    "serving": {"core"},
    "sandbox": {"core"},
    "viewer": {"core"},
    "ray": {"core", "rollout", "serving"},
    "cli": {"core", "rollout", "serving", "sandbox", "viewer", "facade", "ray"},
    "trainers": {"core", "rollout", "serving", "sandbox", "facade", "cli", "ray"},
}


def test_imports_point_one_way() -> None:
    wrong = [
        f"{module} ({_side(module)}) imports {target} ({_side(target)})"
        for module, targets in _graph().items()
        for target in targets
        if _side(target) != _side(module) and _side(target) not in ALLOWED[_side(module)]
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph = _graph()
    # A package's __init__ importing its own submodules is how packages re-export, not a cycle.
    edges = {
        m: {t for t in ts if not m.startswith(t + ".") and not t.startswith(m + ".")}
        for m, ts in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_no_agentrl_module_imports_the_trainers() -> None:
    graph = _graph()
    offenders = [
        m
        for m, ts in graph.items()
        if m.startswith("agentrl.") and any(t.startswith("agentrl_trainers") for t in ts)
    ]
    assert not offenders


@pytest.mark.parametrize("env_id", ["games/Sokoban-v0", "games/GuessNumber-v0"])
def test_env_side_imports_no_torch(env_id: str) -> None:
    code = (
        "import sys, asyncio, agentrl, agentrl.rollout, agentrl.rollout.manager, agentrl.rollout.client, "
        "agentrl.rollout.scripted, agentrl.rollout.evaluate, agentrl.cli, agentrl.ray\n"
        f"env = agentrl.make({env_id!r}); env.reset(seed=0)\n"
        "heavy = ('torch', 'transformers', 'docker', 'tensorboard', 'matplotlib', 'ray')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
