"""Every hint the kit prints names a command and a place that exist: a README/docs section a
message points at is a heading there, a docs/ page exists, and a command is the `ddpkit` one
users have (`ddpkit logs slurm 1 --follow`), not a module path (`python -m ddpkit.tools...`).

Read from every string of the kit's code (messages, help, docstrings shown by --help).

The tests of this file that start processes or take longer: tests/process/tools/test_hints.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE_DIRS = ("ddpkit", "train", "tools", "docker", "slurm", "k8s", "examples")
# `README 'Section'`, `docs/x.md "Section"`, and a bare `docs/x.md`
SECTION = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md)\s+['\"]([^'\"]+)['\"]")
PAGE = re.compile(r"\bdocs/[\w-]+\.md\b")
MODULE_HINT = re.compile(r"python3? -m ddpkit\.tools\.\w+")


def _strings() -> list[tuple[str, str]]:
    """(file:line, text) of every string constant (docstrings and f-string parts too)."""
    out = []
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.value))
    return out


STRINGS = _strings()


def _headings(doc: str) -> list[str]:
    text = (ROOT / ("README.md" if doc.startswith("README") else doc)).read_text()
    return [ln.lstrip("#").strip().lower() for ln in text.splitlines() if ln.startswith("#")]


def test_the_scan_sees_the_kits_messages():
    assert len(STRINGS) > 1000
    assert any("no such directory" in s for _, s in STRINGS)


def test_every_named_section_is_a_heading_that_exists():
    bad = []
    for where, text in STRINGS:
        for doc, section in SECTION.findall(text):
            exists = (ROOT / doc).is_file() or doc.startswith("README")
            if not exists or not any(section.lower() in h for h in _headings(doc)):
                bad.append(f"{where}: {doc} '{section}'")
    assert not bad, "hints naming a section that does not exist:\n" + "\n".join(bad)


def test_every_named_docs_page_exists():
    bad = [
        f"{where}: {page}"
        for where, text in STRINGS
        for page in PAGE.findall(text)
        if not (ROOT / page).is_file()
    ]
    assert not bad, "\n".join(bad)


def test_hints_name_the_ddpkit_command_not_a_module():
    """A message, a usage line, --help's prog or a docstring's usage names `ddpkit CMD`."""
    bad = [f"{where}: {m}" for where, text in STRINGS for m in MODULE_HINT.findall(text)]
    assert not bad, "hints naming `python -m` instead of the ddpkit command:\n" + "\n".join(bad)
