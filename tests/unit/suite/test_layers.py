"""The trainer and the tools import downward only: no module of ddpkit.train or ddpkit.tools
reaches itself again through its imports.

Every `import ddpkit.…` and `from ddpkit.… import …` counts: at module level, inside
functions and under `if TYPE_CHECKING:` alike. A late import hides a circle from the
interpreter, not from the reader; a type named from a higher module is a tie to it too.

The tests of this file that start processes or take longer: tests/process/suite/test_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path


def _imported(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The ddpkit modules that `module` imports, each with the line of its first import."""
    is_package = path.name == "__init__.py"
    out: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name in known and name != module:
            out[name] = min(line, out.get(name, line))

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package that holds this module
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from pkg import mod` ties to mod, else to pkg
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node.lineno)
    return out


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
    """The same ring of modules, entered at another member."""
    ring = a[:-1]
    if len(a) != len(b) or b[0] not in ring:
        return False
    i = ring.index(b[0])
    return ring[i:] + ring[:i] == b[:-1]


def test_the_walk_reads_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    mod = pkg / "mod.py"
    mod.write_text(
        "from typing import TYPE_CHECKING\n"
        "import ddpkit.train.a\n"
        "from ddpkit.train import b, helper\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n"
        "    from ddpkit.train.d import T\n"
        "def f():\n"
        "    from ddpkit.train.e import g\n"
    )
    known = {f"ddpkit.train.{m}": mod for m in ("a", "b", "c", "d", "e", "mod")}
    known["ddpkit.train"] = pkg / "__init__.py"
    got = _imported("ddpkit.train.mod", mod, known)
    assert got == {
        "ddpkit.train.a": 2,
        "ddpkit.train.b": 3,
        "ddpkit.train": 3,  # `helper` is no module: the package itself
        "ddpkit.train.c": 4,
        "ddpkit.train.d": 6,
        "ddpkit.train.e": 8,
    }


def test_the_walk_finds_every_circle():
    graph = {"a": {"b": 1}, "b": {"c": 2, "a": 5}, "c": {"a": 3, "d": 4}, "d": {}}
    assert circles(graph) == [[["a", "b", "a"], ["c", "a", "b", "c"]]]
    assert circles({"a": {"b": 1}, "b": {}}) == []
