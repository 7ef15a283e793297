"""A backend from another package: one package plus one entry-point line.

The toy backend below lives in a temporary directory outside the kit, registered the way a
pip-installed package registers it (an `entry_points.txt` in its .dist-info, group
`ddpkit.backends`), and is driven by the installed `ddpkit` command from a user project.
Nothing in the kit names it: its options table, its rules and its render come with it.

Every test here starts the installed command (with the toy plugin installed or not)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))

TOY = '''
"""A toy scheduler: runs the node launcher under `nice`, in the foreground."""
import subprocess, sys
from dataclasses import dataclass, field
from pathlib import Path

from ddpkit.tools.backends import Backend, JobState, JobStatus, last_job, record_job, state_dir
from ddpkit.tools.jobspec import SpecError, node_command, standalone
from ddpkit.tools.templating import shell_join
from ddpkit.train.dataclass_fields import at_least, checks


@dataclass
class ToyOptions:
    nice: int = field(default=0, metadata=checks(at_least(0)))  # niceness of the job, 0-19
    label: str = "toy"


class ToyBackend(Backend):
    name = "toy"
    file_ext = "sh"
    Options = ToyOptions

    def validate(self, spec):
        super().validate(spec)  # the declared field checks (nice >= 0)
        if self.options(spec).nice > 19:
            raise SpecError(f"toy.nice = {self.options(spec).nice} must be in 0-19; e.g. 10")

    def render(self, spec):
        argv = node_command(spec, standalone(spec.nproc_per_node), python=sys.executable)
        opts = self.options(spec)
        return f"#!/usr/bin/env bash\\n# {opts.label}\\nexec nice -n {opts.nice} {shell_join(argv)}\\n"

    def submit(self, spec, opts):
        path = state_dir() / "toy" / f"{spec.name}.sh"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.render(spec))
        rc = subprocess.run(["bash", str(path)]).returncode
        record_job(self.name, spec.name, rc=rc)
        return rc

    def poll(self, job):
        rc = last_job(self.name)["rc"]
        return JobStatus(job, JobState.SUCCEEDED if rc == 0 else JobState.FAILED, rc)

    def logs(self, job, opts):
        return 0

    def cancel(self, job, opts):
        return 0
'''


def install_plugin(root: Path, module: str = "toyddp", target: str = "toyddp:ToyBackend") -> Path:
    """What `pip install toyddp` leaves on sys.path: the package and its dist-info."""
    (root / module).mkdir(parents=True, exist_ok=True)
    (root / module / "__init__.py").write_text(TOY)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ddpkit.backends]\ntoy = {target}\n")
    return root


def ddpkit(proj: Path, env: dict, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=timeout
    )


SCRIPT = """
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def project(tmp_path):
    plugin = install_plugin(tmp_path / "site")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "ddpkit.toml").write_text(
        textwrap.dedent(
            """
            name = "toyjob"
            accelerator = "cpu"
            script = "train.py"

            [toy]
            nice = 3
            label = "from the job file"
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    return proj, env


def test_a_plugin_backend_renders_with_its_own_typed_options(project):
    proj, env = project
    r = ddpkit(proj, env, "render", "toy")
    assert r.returncode == 0, r.stderr
    assert "# from the job file" in r.stdout
    assert "exec nice -n 3 " in r.stdout and "ddpkit.train.node" in r.stdout
    assert "--nproc-per-node=1" in r.stdout and " train.py" in r.stdout
    r = ddpkit(proj, env, "render", "toy", "--set", "toy.nice=7", "--gpus", "2")
    assert r.returncode == 0, r.stderr
    assert "exec nice -n 7 " in r.stdout and "--nproc-per-node=2" in r.stdout
    spec = ddpkit(proj, env, "render", "toy", "--print-spec")
    assert spec.returncode == 0, spec.stderr
    assert "[toy]" in spec.stdout and "nice = 3" in spec.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["--set", "toy.nice=42"], "toy.nice = 42 must be in 0-19"),  # the plugin's own rule
        (["--set", "toy.nice=-1"], "toy.nice must be >= 0, got -1"),  # a declared field check
        (["--set", "toy.bogus=1"], "unknown key 'bogus'; valid keys in [toy]: nice, label"),
        (["--set", "toy.nice=high"], "cannot parse 'high' as int"),
    ],
)
def test_a_plugin_backends_bad_option_is_one_line(project, one_line_error, args, words):
    proj, env = project
    r = ddpkit(proj, env, "render", "toy", *args)
    assert words in one_line_error(r)


def test_a_mistyped_plugin_table_in_the_job_file_is_one_line(project, one_line_error):
    proj, env = project
    job = proj / "ddpkit.toml"
    job.write_text(job.read_text().replace("nice = 3", 'nice = "very"'))
    assert "toy.nice must be int" in one_line_error(ddpkit(proj, env, "render", "toy"))


def test_other_backends_keep_the_plugin_table_and_never_apply_its_rules(project):
    proj, env = project
    job = proj / "ddpkit.toml"
    job.write_text(job.read_text().replace("nice = 3", "nice = 99"))  # bad for toy only
    r = ddpkit(proj, env, "render", "local")
    assert r.returncode == 0, r.stderr
    # ... and a SLURM rule (grace below the shutdown budget) never refuses a toy job.
    job.write_text(job.read_text().replace("nice = 99", "nice = 1"))
    r = ddpkit(proj, env, "render", "toy", "--set", "slurm.grace_s=1")
    assert r.returncode == 0, r.stderr


def test_a_plugin_backend_runs_the_users_script_through_the_node_launcher(project):
    proj, env = project
    r = ddpkit(proj, env, "submit", "toy", "--gpus", "2", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 of 2" in r.stdout and "rank 1 of 2" in r.stdout
    assert (proj / ".ddpkit" / "toy" / "toyjob.sh").is_file()
    st = ddpkit(proj, env, "status", "toy")
    assert st.returncode == 0 and "succeeded" in st.stdout, st.stdout + st.stderr


def test_without_the_plugin_the_backend_is_unknown_in_one_line(project, one_line_error):
    proj, env = project
    r = ddpkit(proj, {**os.environ, "PYTHONPATH": ""}, "render", "toy")
    assert "invalid choice: 'toy'" in one_line_error(r)


def test_a_broken_plugin_is_named_in_one_line(tmp_path, one_line_error):
    site = install_plugin(tmp_path / "site", target="toyddp.missing:ToyBackend")
    proj = tmp_path / "proj"
    proj.mkdir()
    r = ddpkit(proj, {**os.environ, "PYTHONPATH": str(site)}, "render", "toy")
    assert "backend 'toy' is registered as 'toyddp.missing:ToyBackend'" in one_line_error(r)
