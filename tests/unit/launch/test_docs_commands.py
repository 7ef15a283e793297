"""Every `ddpkit` command of the README and docs/ runs as written, or this file says why it
cannot run here and what stands in for it: a command the docs show is one a user can run.

Each indented `ddpkit ...` line (a `$ ` prompt too, `\\` continuations joined, comments and
pipes cut) is one case:
- run as written, in a project holding the kit's example configs and scripts, exit 0;
- or, where running it here cannot be done in a test (it queues a job, trains for minutes,
  builds an image, needs a Kubernetes API server), the stand-in named in STAND_IN / NEEDS runs
  instead: the same job rendered, with the same flags and the same checks;
- a template line (`{a,b}`, `a|b`, `[OPT]`, `JOB`, `runs/a`, ...) names commands and backends:
  every combination it names is one the CLI has (`list local` may not be shown if refused).
Each `make TARGET` of an indented line is a target of the Makefile and runs as written in the
project (`make -f <kit>/Makefile`), or its render stands in, or MAKE_WHY_NOT says why not.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_docs_commands.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


PLACEHOLDER = re.compile(
    r"[{}\[\]<>|]|\bx\.toml\b|\bJOB\b|\bHEAD\b|\bOUT\b|step-N|runs/a\b|\bNAMESPACE\b"
)
BACKENDS = ("local", "slurm", "k8s", "docker")


def documented_commands() -> list[tuple[str, str]]:
    """(file:line, command) for each indented `ddpkit ...` line."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            line, where = lines[i], f"{doc.relative_to(REPO)}:{i + 1}"
            i += 1
            m = re.match(r"^\s{4,}(?:\$ )?(ddpkit\s.*)$", line)
            if not m:
                continue
            cmd = m.group(1)
            while cmd.rstrip().endswith("\\") and i < len(lines):
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            found.append((where, re.split(r"\s#\s|\s\|\s|\s>\s|\s&&\s", cmd)[0].strip()))
    return found


COMMANDS = documented_commands()
TEMPLATES = [(w, c) for w, c in COMMANDS if PLACEHOLDER.search(c)]
RUNNABLE = [(w, c) for w, c in COMMANDS if not PLACEHOLDER.search(c)]


def test_the_docs_have_commands_to_check():
    assert len(RUNNABLE) >= 15 and len(TEMPLATES) >= 5, COMMANDS  # the parser found them
    assert any("configs/gpt_350m.toml --gpus 512 --nodes 64" in c for _, c in RUNNABLE)


def _alternatives(cmd: str) -> list[list[str]]:
    """The first two words of a template, every alternative spelled out: `a|b`, `{a,b}`."""
    words = [w for w in cmd.split()[1:3] if not w.startswith(("[", "-"))]
    choices = [re.split(r"[|,]", w.strip("{}")) for w in words]
    return [list(c) for c in itertools.product(*choices)]


@pytest.mark.parametrize(("where", "cmd"), TEMPLATES, ids=[w for w, _ in TEMPLATES])
def test_a_documented_template_names_commands_that_exist(where, cmd):
    from ddpkit.tools.backends import Backend, load_backend

    from ddpkit import cli

    commands = {*cli.OWN, *cli.LAUNCH_ACTIONS, *cli.TOOLS}
    for words in _alternatives(cmd):
        assert words[0] in commands, f"{where}: `{cmd}`: no command `ddpkit {words[0]}`"
        if words[0] in cli.LAUNCH_ACTIONS and len(words) > 1 and not words[1].isupper():
            assert words[1] in BACKENDS, f"{where}: `{cmd}`: no backend {words[1]}"
            if words[0] == "list":
                backend = type(load_backend(words[1]))
                assert backend.list_jobs is not Backend.list_jobs, (
                    f"{where}: `{cmd}` shows `ddpkit list {words[1]}`, which the CLI refuses"
                )


def documented_make() -> list[tuple[str, str, list[str]]]:
    """(file:line, target, VAR=value words) of each `make` target an indented line shows:
    `a && make b`, `make a | b` (alternatives) and `[VAR=x]` (optional: left out) included."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            m = re.match(r"^\s{4,}(make\s.*)$", line)
            if not m:
                continue
            text = re.sub(r"\[[^\]]*\]", "", re.split(r"\s#\s", m.group(1))[0])
            parts = re.split(r"\s(\||&&|>)\s", text)  # [part, sep, part, ...]
            for sep, part in zip(["|", *parts[1::2]], parts[0::2], strict=True):
                words = part.split()
                if words and words[0] == "make":
                    words = words[1:]
                elif sep != "|":  # `&& kubectl ...`, `> job.yaml`: not a make target
                    continue
                target = [w for w in words if "=" not in w and not w.startswith("-")]
                if target and re.fullmatch(r"[a-z0-9-]+", target[0]):
                    where = f"{doc.relative_to(REPO)}:{n}"
                    found.append((where, target[0], [w for w in words if "=" in w]))
    return found


MAKE = documented_make()


def test_the_docs_make_lines_are_found():
    assert {"train", "slurm-submit", "k8s-render", "slurm-logs"} <= {t for _, t, _ in MAKE}


def test_the_readme_install_states_what_pip_needs():
    """The Python pyproject.toml requires, how to take torch's CPU build, the shared venv."""
    import tomllib

    readme = (REPO / "README.md").read_text()
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"Python {requires.replace('>=', '>= ')}" in readme, requires
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    assert "venv on the shared filesystem" in readme
