"""pyproject.toml tells the truth: what the code imports is declared, the bounds hold.

Here the tests that start processes; the in-process ones in tests/unit/launch/test_packaging.py.
Helpers both use are in tests/unit/launch/test_packaging.py."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.unit.launch.test_packaging import PROJECT, ROOT, _name

# the repo's own top-level names (nodeagent: k8s/local/nodeagent, the local cluster's node agent;
# toyengine: the package tests/unit/backends/test_builtin_engine_place.py writes into its tmp dir)
LOCAL = {"train", "tools", "bench", "tests", "docker", "nodeagent", "toyengine"}


def _imports(paths: list[Path]) -> set[str]:
    mods: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m not in LOCAL}


def test_every_third_party_import_is_declared():
    declared = {_name(r) for r in PROJECT["dependencies"]}
    for reqs in PROJECT["optional-dependencies"].values():
        declared |= {_name(r) for r in reqs}
    dists = packages_distributions()
    code = [
        p for d in ("train", "tools", "tests", "bench") for p in sorted((ROOT / d).rglob("*.py"))
    ]
    missing = {}
    for mod in _imports(code):
        names = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
        if not names & declared:
            missing[mod] = sorted(names)
    assert not missing, f"imported but not in pyproject.toml: {missing}"
