"""A backend from another package: one package plus one entry-point line.

The toy backend below lives in a temporary directory outside the kit, registered the way a
pip-installed package registers it (an `entry_points.txt` in its .dist-info, group
`ddpkit.backends`), and is driven by the installed `ddpkit` command from a user project.
Nothing in the kit names it: its options table, its rules and its render come with it.

Here the tests that run in this process; those that start processes in
tests/process/backends/test_plugin_backend.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_a_broken_plugin_is_named_in_one_line(tmp_path, one_line_error):
    site = install_plugin(tmp_path / "site", target="toyddp.missing:ToyBackend")
    proj = tmp_path / "proj"
    proj.mkdir()
    r = ddpkit(proj, {**os.environ, "PYTHONPATH": str(site)}, "render", "toy")
    assert "backend 'toy' is registered as 'toyddp.missing:ToyBackend'" in one_line_error(r)
