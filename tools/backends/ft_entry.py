"""Whether a job's own entry point takes part in torchft (`fault_tolerance = "torchft"`).

Under torchft every replica group runs the entry point; only a script that builds torchft's
`Manager` (or calls `ddpkit.train.fit`, which builds it) exchanges gradients across groups.
A plain DDP script runs as N independent copies on the same data: identical losses, no
exchange, exit 0. So the entry point is read before anything starts (never run: its syntax
tree, so a comment or a string naming the Manager does not count), with the project's own
modules it imports (a helper module may build the Manager), and a job whose entry never
calls either is refused in one line naming the docs section that shows the change.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ddpkit.tools.jobspec import JobSpec, SpecError

DOCS = "docs/fault-tolerance.md (section 'Your own script')"
MAX_FILES = 200  # the project's modules read at most (a package's own, not site-packages)


def _calls(tree: ast.AST) -> set[str]:
    """Every call's callee as a dotted name through the file's imports (`import torchft as
    ft; ft.Manager(...)` -> torchft.Manager), anywhere in the file (in functions too)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    return {d for n in ast.walk(tree) if isinstance(n, ast.Call) and (d := dotted(n.func))}


def joins_torchft(calls: set[str]) -> bool:
    """A call of torchft's Manager (torchft.Manager, torchft.manager.Manager) or of ddpkit's
    fit (ddpkit.train.fit: the kit's trainer as one replica group)."""
    return any(
        (c.startswith("torchft.") and c.endswith(".Manager"))
        or (c.startswith("ddpkit.train") and c.endswith(".fit"))
        for c in calls
    )


def _imported_files(tree: ast.AST, here: Path, roots: list[Path]) -> list[Path]:
    """The project's own .py files a file imports (found under roots, or beside it for a
    relative import); an installed package is not followed."""
    wanted: list[tuple[list[Path], str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [(roots, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = roots
            if node.level:
                up = here.parent
                for _ in range(node.level - 1):
                    up = up.parent
                base = [up]
            mod = node.module or ""
            wanted.append((base, mod))
            wanted += [(base, f"{mod}.{a.name}" if mod else a.name) for a in node.names]
    found = []
    for bases, mod in wanted:
        if not mod:
            continue
        rel = Path(*mod.split("."))
        for b in bases:
            for f in (b / rel.with_suffix(".py"), b / rel / "__init__.py"):
                if f.is_file():
                    found.append(f.resolve())
    return found


def check_torchft_entry(spec: JobSpec, kind: str, name: str, path: str | None) -> None:
    """Refuse (SpecError, one line) a torchft job whose own entry point never builds torchft's
    Manager nor calls ddpkit.train.fit, in its file or the project's modules it imports.
    path: the entry's file (a module's as the job's Python finds it); None: not a .py file
    (nothing to read: not refused)."""
    if spec.fault_tolerance != "torchft" or spec.default_entry or path is None:
        return
    if kind == "module" and name.split(".")[0] == "ddpkit":
        return  # the kit's own trainer under another name
    entry = Path(path).resolve()
    top = entry.parent  # the directory the entry's top package sits in (absolute imports)
    while (top / "__init__.py").is_file() and top.parent != top:
        top = top.parent
    roots = list(dict.fromkeys([Path.cwd().resolve(), entry.parent, top]))
    todo, seen = [entry], set()
    while todo and len(seen) < MAX_FILES:
        f = todo.pop()
        if f in seen or not str(f).endswith(".py"):
            continue
        seen.add(f)
        try:
            tree = ast.parse(f.read_bytes(), str(f))
        except (OSError, SyntaxError, ValueError):
            continue  # an unreadable helper: the entry itself compiled (check_entry_point)
        if joins_torchft(_calls(tree)):
            return
        todo += _imported_files(tree, f, roots)
    raise SpecError(
        f"fault_tolerance = torchft: the {kind} {name!r} never builds torchft's Manager (nor "
        f"calls ddpkit.train.fit), so its {spec.groups} replica groups would train as unrelated "
        f"copies on the same data; make it fault tolerant as {DOCS} shows, or set "
        'fault_tolerance = "none"'
    )
