"""`ddpkit logs local` while the job runs, as a user watches it: a project in a temp dir whose
own train.py prints (plain print, no flush) and then waits; the installed `ddpkit run` in one
process, `ddpkit logs local [--follow]` from the same project in others. The log shows what
the script printed so far, and --follow prints it as it grows and ends with the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))

# Prints three lines, then waits for the test's word (a file) before its last line.
TRAIN_PY = """\
import os, time
for i in range(3):
    print(f"line {i} of rank {os.environ['RANK']}")
    time.sleep(0.2)
deadline = time.monotonic() + 300
while not os.path.exists("release") and time.monotonic() < deadline:
    time.sleep(0.2)
print("last line")
"""


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}


def ddpkit(proj: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env(), capture_output=True, text=True, timeout=120
    )


def test_logs_show_the_running_job_and_follow_it_to_its_end(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN_PY)
    run = subprocess.Popen(
        [DDPKIT, "run", "train.py", "--gpus", "1"], cwd=proj, env=env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    follow = None
    try:
        deadline, seen = time.monotonic() + 240, ""
        while "line 2 of rank 0" not in seen:
            assert run.poll() is None, f"the job ended first:\n{run.communicate()[0]}"
            assert time.monotonic() < deadline, f"`ddpkit logs local` never showed it: {seen!r}"
            time.sleep(0.5)
            seen = ddpkit(proj, "logs", "local").stdout
        assert "line 0 of rank 0" in seen and "last line" not in seen, seen

        follow = subprocess.Popen(
            [DDPKIT, "logs", "local", "--follow"], cwd=proj, env=env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)
        assert follow.poll() is None, "--follow ended while the job still ran"
        (proj / "release").touch()
        out, err = follow.communicate(timeout=120)
        assert follow.returncode == 0, out + err
        assert out.index("line 0 of rank 0") < out.index("last line"), out
        assert run.wait(timeout=120) == 0
    finally:
        for proc in (run, follow):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_follow_is_in_every_backends_logs_help(tmp_path, backend):
    r = ddpkit(tmp_path, "logs", backend, "--help")
    assert r.returncode == 0, r.stderr
    assert "--follow" in r.stdout, r.stdout


def test_the_commands_list_names_follow(tmp_path):
    r = ddpkit(tmp_path, "--help")
    [logs] = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("logs ")]
    assert "--follow" in logs, r.stdout


# A plugin backend (what `pip install` of another package registers) whose logs cannot follow.
PLUGIN = """
from ddpkit.tools.backends import Backend

class NoFollow(Backend):
    name = "nofollow"
    file_ext = "sh"
    def render(self, spec): return ""
    def submit(self, spec, opts): return 0
    def poll(self, job): raise NotImplementedError
    def logs(self, job, opts): return 0
    def cancel(self, job, opts): return 0
"""


def test_a_backend_that_cannot_follow_says_so_in_one_line(tmp_path, one_line_error):
    site = tmp_path / "site"
    (site / "nofollow-0.1.dist-info").mkdir(parents=True)
    (site / "nofollow.py").write_text(PLUGIN)
    (site / "nofollow-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nofollow\nVersion: 0.1\n"
    )
    (site / "nofollow-0.1.dist-info" / "entry_points.txt").write_text(
        "[ddpkit.backends]\nnofollow = nofollow:NoFollow\n"
    )
    r = subprocess.run(
        [DDPKIT, "logs", "nofollow", "--follow"], cwd=tmp_path,
        env={**env(), "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = one_line_error(r)
    assert "nofollow backend cannot follow" in line and "after `--`" not in line, line
