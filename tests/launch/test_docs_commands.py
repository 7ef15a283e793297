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
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
PLACEHOLDER = re.compile(
    r"[{}\[\]<>|]|\bx\.toml\b|\bJOB\b|\bHEAD\b|\bOUT\b|step-N|runs/a\b|\bNAMESPACE\b"
)
BACKENDS = ("local", "slurm", "k8s", "docker")

# Commands that cannot run in a test as written, and the reason: the job rendered instead.
STAND_IN = {
    "submit": "queues a job (SLURM, Kubernetes, a container) or trains here for minutes",
    "run": "trains here for minutes (2 processes on 2 CPU cores)",
    "build": "builds a container image (minutes, a registry's base image)",
}
# Commands that need what a test machine may lack: (what, how to tell it is here).
NEEDS_K8S = "a Kubernetes API server and a submitted job (tests/engines/k8s/test_k8s_real.py)"


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


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A project holding the kit's example configs and scripts (the paths the docs use), a
    train.py and a models/ package of its own (what `ddpkit init` finds), and job.toml: "your job" of the planner's
    examples, the ~350M gpt with the data of a real 512-rank run."""
    ws = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "configs", ws / "configs")
    shutil.copytree(REPO / "examples", ws / "examples")
    for job in (ws / "configs").glob("*.toml"):  # their workspace is the kit's root: here
        job.write_text(job.read_text().replace('workspace = ".."', f'workspace = "{ws}"'))
    job = (ws / "configs" / "gpt_350m.toml").read_text()
    assert "synthetic_samples = 1024" in job
    (ws / "job.toml").write_text(
        job.replace("synthetic_samples = 1024", "synthetic_samples = 65536")
    )
    (ws / "models").mkdir()  # "your own model" of docs/tools.md: a factory for 3x32x32 images
    (ws / "models" / "__init__.py").write_text(
        "import torch.nn as nn\n\n\ndef build_model(cfg=None, in_shape=None, num_classes=None):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))\n"
    )
    (ws / "train.py").write_text(
        "import torch.distributed as dist\n\n"
        "if __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
    )
    return ws


def _argv(cmd: str, ws: Path) -> tuple[list[str], Path]:
    """The argv that runs here for `cmd`, and the directory it runs in."""
    argv = shlex.split(cmd)[1:]
    if argv[0] == "init":  # writes ddpkit.toml: a fresh copy of the project each time
        project = ws.parent / f"init-{len(list(ws.parent.glob('init-*')))}"
        project.mkdir()
        shutil.copy(ws / "train.py", project / "train.py")
        return argv, project
    if argv[0] in STAND_IN:  # the same job rendered: `run` is `submit local`, `build` docker's
        rest = [a for a in argv[1:] if a != "--wait"]
        backend = {"run": ["local"], "build": ["docker"]}.get(argv[0], [])
        argv = ["render", *backend, *rest]
        argv.insert(argv.index("--") if "--" in argv else len(argv), "--quiet")
    return argv, ws


def slurm_controller_answers() -> bool:
    if not shutil.which("squeue"):
        return False
    r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60)
    return r.returncode == 0


@pytest.mark.parametrize(("where", "cmd"), RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_a_documented_command_runs_as_written(workspace, where, cmd):
    argv = shlex.split(cmd)[1:]
    if argv[0] in ("status", "logs", "cancel", "list") and argv[1] == "k8s":
        pytest.skip(f"needs {NEEDS_K8S}")
    if argv[0] == "list" and argv[1] == "slurm" and not slurm_controller_answers():
        # The SLURM cluster is up only while the slurm tests run (another lane of make test).
        pytest.skip("needs a running SLURM controller (the slurm tests start one and run it)")
    run, cwd = _argv(cmd, workspace)
    r = subprocess.run([DDPKIT, *run], cwd=cwd, capture_output=True, text=True, timeout=300)
    stand_in = f" (run as `ddpkit {shlex.join(run)}`: {STAND_IN[argv[0]]})" if run != argv else ""
    assert r.returncode == 0, f"{where}: `{cmd}`{stand_in} -> exit {r.returncode}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


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


# --- the Makefile's ways in -----------------------------------------------------------------

# Targets the docs show that a test cannot run as written, and why (the stand-in or the test
# that covers them).
MAKE_WHY_NOT = {
    "setup": "installs the kit's own venv, which this test runs from",
    "test": "the whole test suite, this file included",
    "test-fast": "the unit tests, this file included",
    "coverage": "the whole test suite under coverage.py, this file included",
    "lint": "CI's lint step over the checkout",
    "train": "trains for minutes; tests/process/launch/test_make.py runs `make train` on a short job",
    "bench": "benchmarks for minutes",
    "docker-build": "builds a container image (the container tests do)",
    "docker-run": "runs a container image (the container tests do)",
    "k8s-up": "starts a Kubernetes control plane (the k8s tests do)",
    "k8s-down": "stops the Kubernetes control plane other tests use",
    "k8s-delete": "needs a Kubernetes API server (kubectl delete)",
    "slurm-up": "starts the machine's SLURM cluster, which the slurm tests share",
    "slurm-down": "stops the SLURM cluster other tests use",
    "slurm-status": "needs a job submitted from the workspace (the slurm tests submit one)",
    "slurm-logs": "needs a job submitted from the workspace (the slurm tests submit one)",
    "slurm-cancel": "needs a job submitted from the workspace (the slurm tests submit one)",
}
# Targets that queue or apply a job: the render target of the same job runs instead.
MAKE_STAND_IN = {"slurm-submit": "slurm-render", "k8s-apply": "k8s-render"}
MAKE_TARGETS = set(re.findall(r"^([a-z0-9-]+):", (REPO / "Makefile").read_text(), re.M))


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


@pytest.mark.parametrize(
    ("where", "target", "variables"), MAKE, ids=[f"{w}:{t}" for w, t, _ in MAKE]
)
def test_a_documented_make_target_runs_as_written(workspace, where, target, variables):
    assert target in MAKE_TARGETS, f"{where}: `make {target}`: the Makefile has no such target"
    run = MAKE_STAND_IN.get(target, target)
    if run in MAKE_WHY_NOT:
        pytest.skip(f"make {target}: {MAKE_WHY_NOT[run]}")
    from tests.trainrun import clean_env

    r = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", str(REPO / "Makefile"),
         "-o", str(REPO / ".venv" / ".installed"), run, *variables],
        cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    how = f" (run as `make {run}`: it queues or applies the job)" if run != target else ""
    assert r.returncode == 0, f"{where}: `make {target}`{how} -> exit {r.returncode}\n{r.stderr}"


def test_the_readme_install_states_what_pip_needs():
    """The Python pyproject.toml requires, how to take torch's CPU build, the shared venv."""
    import tomllib

    readme = (REPO / "README.md").read_text()
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"Python {requires.replace('>=', '>= ')}" in readme, requires
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    assert "venv on the shared filesystem" in readme
