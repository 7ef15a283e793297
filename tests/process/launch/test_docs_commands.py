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

Here the tests that start processes; the in-process ones in
tests/unit/launch/test_docs_commands.py. Helpers both use are in
tests/unit/launch/test_docs_commands.py."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.launch.test_docs_commands import MAKE, REPO, RUNNABLE

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))


# Commands that cannot run in a test as written, and the reason: the job rendered instead.
STAND_IN = {
    "submit": "queues a job (SLURM, Kubernetes, a container) or trains here for minutes",
    "run": "trains here for minutes (2 processes on 2 CPU cores)",
    "build": "builds a container image (minutes, a registry's base image)",
}
# Commands that need what a test machine may lack: (what, how to tell it is here).
NEEDS_K8S = "a Kubernetes API server and a submitted job (tests/engines/k8s/test_k8s_real.py)"


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
    if argv[0] in ("status", "logs", "cancel") and argv[1] == "slurm":
        pytest.skip("needs a job submitted from the workspace (the slurm tests submit one)")
    if argv[0] == "list" and argv[1] == "slurm" and not slurm_controller_answers():
        # The SLURM cluster is up only while the slurm tests run (another lane of make test).
        pytest.skip("needs a running SLURM controller (the slurm tests start one and run it)")
    run, cwd = _argv(cmd, workspace)
    r = subprocess.run([DDPKIT, *run], cwd=cwd, capture_output=True, text=True, timeout=300)
    stand_in = f" (run as `ddpkit {shlex.join(run)}`: {STAND_IN[argv[0]]})" if run != argv else ""
    assert r.returncode == 0, f"{where}: `{cmd}`{stand_in} -> exit {r.returncode}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


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
