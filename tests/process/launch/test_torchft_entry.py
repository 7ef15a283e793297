"""fault_tolerance = "torchft" on an entry point that never joins torchft: a user's plain DDP
script ran as two unrelated copies (same data, identical losses, no exchange) and exited 0.
From a project in a temp dir with the installed `ddpkit`: such a script or module is refused
in one line naming the docs section, before anything starts (no run dir, nothing queued: a
fake sbatch records any call); one that builds torchft's Manager, in its own file or in a
module of the project it imports, or calls ddpkit.train.fit, is taken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeBin

REPO = Path(__file__).resolve().parents[3]
DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
JOB = 'name = "ft"\nnproc_per_node = 1\naccelerator = "cpu"\nfault_tolerance = "torchft"\n'

PLAIN = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
print("trained", flush=True)
dist.destroy_process_group()
"""
# Names the Manager only in a comment and a string: still a plain script.
NAMED_ONLY = (
    '# with torchft: manager = torchft.Manager(pg=...)\nNOTE = "torchft.Manager(pg)"\n' + PLAIN
)
HELPER = """\
import torchft

def manager(pg, load, save):
    return torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=load, state_dict=save)
"""
USES_HELPER = "from mylib.ft import manager\n" + PLAIN
FIT = "from ddpkit.train import fit\n\nif __name__ == '__main__':\n    fit(None, None)\n"


def project(tmp_path: Path, entry: str, text: str) -> tuple[Path, dict[str, str], Path]:
    proj = tmp_path / "proj"
    (proj / "mylib").mkdir(parents=True)
    (proj / "mylib" / "__init__.py").write_text("")
    (proj / "mylib" / "ft.py").write_text(HELPER)
    if entry.endswith(".py"):
        (proj / entry).write_text(text)
        (proj / "ddpkit.toml").write_text(JOB + f'script = "{entry}"\n')
    else:  # a package run as `python -m`
        (proj / entry).mkdir()
        (proj / entry / "__init__.py").write_text("")
        (proj / entry / "__main__.py").write_text(text)
        (proj / "ddpkit.toml").write_text(JOB + f'module = "{entry}"\n')
    calls = tmp_path / "sbatch-calls"
    fakes = FakeBin(tmp_path / "bin")
    for name in ("sbatch", "sinfo", "squeue", "scontrol", "sacct"):
        fakes.add(name, f'#!/bin/sh\necho "{name} $*" >> {calls}\necho 4242\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}
    env["PATH"] = f"{fakes.path}:{env['PATH']}"
    return proj, env, calls


def ddpkit(proj: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("entry", "text"),
    [("train.py", PLAIN), ("train.py", NAMED_ONLY), ("trainer", PLAIN)],
    ids=["plain-script", "manager-only-in-a-comment-and-a-string", "plain-module"],
)
@pytest.mark.parametrize("action", [["run"], ["submit", "slurm", "--nodes", "2"]])
def test_an_entry_that_never_joins_torchft_is_refused_before_anything_starts(
    tmp_path, one_line_error, entry, text, action
):
    proj, env, calls = project(tmp_path, entry, text)
    line = one_line_error(ddpkit(proj, env, *action))
    assert "fault_tolerance = torchft" in line and "never builds torchft's Manager" in line, line
    assert "docs/fault-tolerance.md (section 'Your own script')" in line, line
    assert not (proj / "runs").exists(), "something started"
    assert not calls.exists(), f"SLURM was called: {calls.read_text()}"


def test_the_refusal_names_a_section_the_docs_have():
    text = (REPO / "docs" / "fault-tolerance.md").read_text()
    assert "\n## Your own script\n" in text


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        ("torchft_fit.py", (REPO / "examples/plain_torchrun/torchft_fit.py").read_text()),
        ("train.py", USES_HELPER),  # the Manager built in a module of the project
        ("train.py", FIT),
        ("trainer", "from mylib.ft import manager\n"),
        ("trainer", "from .setup import go\n"),  # a relative import, followed
    ],
    ids=["docs-example", "helper-module", "ddpkit-fit", "module-helper", "module-relative"],
)
def test_an_entry_that_builds_the_manager_or_calls_fit_is_taken(tmp_path, entry, text):
    proj, env, _ = project(tmp_path, entry, text)
    if text.startswith("from .setup"):
        (proj / entry / "setup.py").write_text(HELPER + "\ndef go():\n    pass\n")
    for backend in (["local"], ["slurm", "--nodes", "2"]):
        r = ddpkit(proj, env, "render", *backend)
        assert r.returncode == 0, r.stderr
