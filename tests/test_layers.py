"""The trainer and the tools import downward only: no module of ddpkit.train or ddpkit.tools
reaches itself again through its imports.

Every `import ddpkit.…` and `from ddpkit.… import …` counts, at module level and inside
functions alike (a late import hides a circle from the interpreter, not from the reader).
Only `if TYPE_CHECKING:` blocks are left out: they never run, they name types.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PACKAGES = ("ddpkit.train", "ddpkit.tools")


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


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The ddpkit modules that `module` imports (anywhere but TYPE_CHECKING), with a line."""
    is_package = path.name == "__init__.py"
    out: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name in known and name != module:
            out.setdefault(name, line)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package that holds this module
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    known = _modules()
    return {m: _imported(m, p, known) for m, p in known.items()}, known


def circles(graph: dict[str, dict[str, int]]) -> list[list[list[str]]]:
    """The groups of modules that reach each other (Tarjan), each as its closed paths: the
    shortest one through every member, the duplicates dropped."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for group in sorted(groups):
        loops: list[list[str]] = []
        for start in group:
            loop = _shortest_loop(graph, group, start)
            if not any(_same_loop(loop, seen) for seen in loops):
                loops.append(loop)
        out.append(loops)
    return out


def _shortest_loop(graph: dict[str, dict[str, int]], group: list[str], start: str) -> list[str]:
    """The shortest path from start back to itself through the group's modules."""
    members = set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return [*paths[v], start]
                if w in members and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no loop through {start} in {group}")  # Tarjan said there was one


def _same_loop(a: list[str], b: list[str]) -> bool:
    if len(a) != len(b):
        return False
    ring = a[:-1]
    i = ring.index(b[0]) if b[0] in ring else -1
    return i >= 0 and ring[i:] + ring[:i] == b[:-1]


def describe(loop: list[str], graph: dict[str, dict[str, int]], known: dict[str, Path]) -> str:
    """`a -> b -> a` and, for each arrow, the file and line of the import that draws it."""
    ties = ", ".join(f"{known[a].name}:{graph[a][b]}" for a, b in zip(loop, loop[1:]))
    return "  " + " -> ".join(m.removeprefix("ddpkit.") for m in loop) + f"  ({ties})"


def test_the_walk_sees_the_trainer_and_the_tools():
    graph, known = import_graph()
    assert {"ddpkit.train.registry", "ddpkit.train.config", "ddpkit.tools.memory"} <= set(known)
    assert "ddpkit.tools.backends.k8s" in known  # subpackages too
    assert "ddpkit.train.errors" in graph["ddpkit.train.config"]  # module level
    assert "ddpkit.train.models" in graph["ddpkit.tools.memory_model"]  # inside a function


def test_the_walk_finds_every_circle():
    graph = {"a": {"b": 1}, "b": {"c": 2, "a": 5}, "c": {"a": 3, "d": 4}, "d": {}}
    assert circles(graph) == [[["a", "b", "a"], ["b", "c", "a", "b"]]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph, known = import_graph()
    found = [g for g in circles(graph) if f"{g[0][0]}.".startswith(f"{package}.")]
    text = "\n\n".join("\n".join(describe(loop, graph, known) for loop in g) for g in found)
    assert not found, f"import circles in {package} (a -> b: a imports b):\n{text}"
