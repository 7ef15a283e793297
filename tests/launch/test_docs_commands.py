"""Every concrete `ddpkit render|submit` and `ddpkit memory` command of the README and docs/
parses and validates as written: a command the docs show is one a user can run.

A submit is checked as the render of the same job (the same flags, the same spec and backend
rules; nothing is queued): the command lines of the docs cannot drift from the CLI unseen.
Lines with placeholders (`{a,b}`, `[OPT]`, `x.toml`, `JOB`) are templates, not commands.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
PLACEHOLDER = re.compile(r"[{}\[\]<>|]|\bx\.toml\b|\bJOB\b|\bHEAD\b|\bOUT\b|step-N|runs/a\b")


def documented_commands() -> list[tuple[str, str]]:
    """(file:line, command) for each indented `ddpkit render|submit|memory ...` line, with
    its `\\` continuations joined, comments and pipes cut."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            line, where = lines[i], f"{doc.relative_to(REPO)}:{i + 1}"
            i += 1
            m = re.match(r"^\s{4,}(ddpkit (?:render|submit|memory) .*)$", line)
            if not m:
                continue
            cmd = m.group(1)
            while cmd.rstrip().endswith("\\") and i < len(lines):
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            cmd = re.split(r"\s#\s|\s\|\s|\s>\s|\s&&\s", cmd)[0].strip()
            if not PLACEHOLDER.search(cmd):
                found.append((where, cmd))
    return found


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 8, COMMANDS  # the parser found the docs' command lines


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A project holding the kit's example configs and scripts (the paths the docs use)."""
    ws = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "configs", ws / "configs")
    shutil.copytree(REPO / "examples", ws / "examples")
    for job in (ws / "configs").glob("*.toml"):  # their workspace is the kit's root: here
        job.write_text(job.read_text().replace('workspace = ".."', f'workspace = "{ws}"'))
    # "your job" of the planner's examples: the ~350M gpt the README's plan was made for,
    # with data for a 512-rank global batch (its example file has 1,024 samples)
    job = (ws / "configs" / "gpt_350m.toml").read_text()
    assert "synthetic_samples = 1024" in job
    (ws / "job.toml").write_text(
        job.replace("synthetic_samples = 1024", "synthetic_samples = 65536")
    )
    return ws


@pytest.mark.parametrize(("where", "cmd"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses_and_validates(workspace, where, cmd):
    argv = shlex.split(cmd)[1:]
    if argv[0] == "submit":  # the same job, rendered: nothing is queued
        argv = ["render", *[a for a in argv[1:] if a != "--wait"], "--quiet"]
    if argv[0] == "memory":
        argv.append("--json")
    r = subprocess.run([DDPKIT, *argv], cwd=workspace, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{where}: `{cmd}` -> exit {r.returncode}\n{r.stdout}{r.stderr}"
