"""Imports point one way: tasks -> records -> evaluation and policy -> rollout -> rewards -> training -> monitor ->
tracking, config, experiment -> flows -> kevin_cli (the command line, outside the library).

Every module under kevin/, flows/ and kevin_cli/ is parsed with ``ast`` (nothing is imported) and mapped to its
layer; an import of a higher layer fails the test, lazy imports inside functions and module names handed to
``import_module`` as strings included. A module the map does not place fails too, so a new module is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Longest matching prefix wins. Same layer: may import each other; lower: may be imported.
LAYERS: dict[str, int] = {
    "kevin": 0,              # the package itself (version string only): not a prefix, see ONLY_ITSELF
    "kevin.settings": 0,     # the config base class
    "kevin.distributed": 0,  # the process group and its collectives (used by the policy and the trainer)
    "kevin.pipeline": 0,     # what the DVC stages write besides the library's outputs (pure functions over files)
    "kevin.tasks": 1,
    "kevin.records": 2,
    "kevin.evaluation": 3,
    "kevin.policy": 3,
    "kevin.rollout": 4,
    "kevin.rewards": 5,
    "kevin.training": 6,
    "kevin.monitor": 7,      # reads responses and update metrics; steers nothing but its stop flag
    "kevin.analysis": 7,     # test-time-scaling metrics over finished rollouts
    "kevin.datachecks": 7,   # expectations over splits and rollout records
    "kevin.tracking": 8,     # the one place that talks to MLflow
    "kevin.alerts": 8,       # collapse alerts as Prefect events
    "kevin.params": 8,       # params.yaml: read, override, hand shared values down
    "kevin.config": 8,       # the root config composing every section
    "kevin.experiment": 8,   # a training run: its steps as methods over files (tracking and alerts wired in)
    "flows": 9,              # Prefect flows: orchestration only
    "kevin_cli": 10,         # the entry point, outside the library: `kevin train` runs the training flow
}
# Entries that place the module itself only: were "kevin" a prefix, every module the map forgot would land on
# layer 0 and pass unnoticed.
ONLY_ITSELF = frozenset({"kevin"})


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS and (prefix == module or prefix not in ONLY_ITSELF):
            return LAYERS[prefix]
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source``: statements anywhere (lazy ones too), relative ones
    resolved, and string constants that name a module of ours (lazy registries, ``import_module``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from kevin import training`` imports a subpackage: judge the names too.
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names if layer_of(f"{target}.{alias.name}")
                      is not None and f"{target}.{alias.name}" in ALL_MODULES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ALL_MODULES:
            found.append((node.lineno, node.value))
    return found


def _sources() -> dict[str, Path]:
    paths = [p for package in ("kevin", "flows", "kevin_cli") for p in sorted((REPO / package).rglob("*.py"))]
    return {module_name(p): p for p in paths}


SOURCES = _sources()
ALL_MODULES = frozenset(SOURCES)


def violations(module: str, source: str, is_package: bool) -> list[str]:
    mine = layer_of(module)
    out = []
    for line, target in imported_modules(source, module, is_package):
        theirs = layer_of(target)
        if theirs is not None and mine is not None and theirs > mine:
            out.append(f"{module}:{line} imports {target} (layer {theirs} above its own {mine})")
    return out


def test_every_module_is_placed_in_a_layer():
    unplaced = sorted(m for m in SOURCES if layer_of(m) is None)
    assert not unplaced, f"add these modules to LAYERS in {Path(__file__).name}: {unplaced}"


def test_no_module_imports_a_higher_layer():
    found = []
    for module, path in SOURCES.items():
        found += violations(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    assert not found, "upward imports:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "from kevin.training.distributed import world\n",
    "def f():\n    from kevin.rollout import loop\n",
    "import kevin.training.trainer\n",
    "from kevin import training\n",
    "LAZY = {'Trainer': 'kevin.training.trainer'}\n",
    "from ..rollout import loop\n",
    "def f():\n    from kevin_cli.common import die\n",
])
def test_the_check_sees_upward_imports_of_every_kind(source):
    # A policy module (layer 3) reaching up into rollout (4) or training (6), in each way an import can be written.
    assert violations("kevin.policy.probe", source, is_package=False)


def test_the_check_allows_the_same_and_lower_layers():
    source = "from kevin.records.generation import Prompt\nimport kevin.settings\nfrom . import hf\n"
    assert violations("kevin.policy.probe", source, is_package=False) == []
