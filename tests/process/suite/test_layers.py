"""The trainer and the tools import downward only: no module of ddpkit.train or ddpkit.tools
reaches itself again through its imports.

Every `import ddpkit.…` and `from ddpkit.… import …` counts: at module level, inside
functions and under `if TYPE_CHECKING:` alike. A late import hides a circle from the
interpreter, not from the reader; a type named from a higher module is a tie to it too.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/suite/test_layers.py."""

from __future__ import annotations

import importlib.util
from itertools import pairwise
from pathlib import Path

import pytest

from tests.unit.suite.test_layers import _imported, circles

PACKAGES = ("ddpkit.train", "ddpkit.tools", "ddpkit.slurm", "ddpkit.k8s", "ddpkit.docker")


def _modules() -> dict[str, Path]:
    """Every module under PACKAGES, by dotted name, from the files the install points at."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        for root in map(Path, spec.submodule_search_locations):
            for path in sorted(root.rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join([package, *parts])] = path
    return found


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    known = _modules()
    return {m: _imported(m, p, known) for m, p in known.items()}, known


def describe(loop: list[str], graph: dict[str, dict[str, int]], known: dict[str, Path]) -> str:
    """`a -> b -> a` and, for each arrow, the file and line of the import that draws it."""
    ties = ", ".join(f"{Path(*known[a].parts[-2:])}:{graph[a][b]}" for a, b in pairwise(loop))
    return "  " + " -> ".join(m.removeprefix("ddpkit.") for m in loop) + f"  ({ties})"


def test_the_walk_sees_the_trainer_and_the_tools():
    graph, known = import_graph()
    assert {"ddpkit.train.registry", "ddpkit.train.config", "ddpkit.tools.planner.cli"} <= set(
        known
    )
    assert "ddpkit.k8s.backend" in known  # the engines' packages too
    assert "ddpkit.train.errors" in graph["ddpkit.train.config"]  # module level
    assert "ddpkit.train.models" in graph["ddpkit.tools.planner.model"]  # inside a function


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph, known = import_graph()
    found = [g for g in circles(graph) if f"{g[0][0]}.".startswith(f"{package}.")]
    if found:
        text = "\n\n".join("\n".join(describe(loop, graph, known) for loop in g) for g in found)
        pytest.fail(f"import circles in {package} (a -> b: a imports b):\n{text}", pytrace=False)
