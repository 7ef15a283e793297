"""$DDPKIT_CKPT_DIR for a user's own script, as README.md and docs/running.md say it: the
job's ckpt_dir, by default <run dir>/checkpoints, relative to the workspace the script starts
in, and not created before the script starts (the script makes it). The example
preemptible.py saves there on a stop and resumes from there. The installed `ddpkit`, run from
a project directory in a temp dir, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DDPKIT = str(Path(sys.executable).with_name("ddpkit"))

SHOW_ENV = """\
import json, os
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    ckpt, run = os.environ["DDPKIT_CKPT_DIR"], os.environ["DDPKIT_RUN_DIR"]
    seen = {"cwd": os.getcwd(), "ckpt": ckpt, "run": run, "ckpt_exists": os.path.exists(ckpt)}
    print("ENV " + json.dumps(seen), flush=True)
dist.destroy_process_group()
"""


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DDPKIT_", "PYTHONPATH"))}


def ddpkit(proj: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env(), capture_output=True, text=True, timeout=timeout
    )


def seen_env(out: str) -> dict:
    [line] = [ln for ln in out.splitlines() if ln.startswith("ENV ")]
    return json.loads(line[4:])


@pytest.mark.parametrize("how", ["job-file", "no-job-file"])
def test_the_ckpt_dir_is_the_run_dirs_checkpoints_and_the_script_creates_it(tmp_path, how):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SHOW_ENV)
    if how == "job-file":
        assert ddpkit(proj, "init").returncode == 0
        r = ddpkit(proj, "run")
    else:
        r = ddpkit(proj, "run", "train.py")
    assert r.returncode == 0, r.stdout + r.stderr
    seen = seen_env(r.stdout)
    assert Path(seen["cwd"]) == proj  # the workspace: a relative dir is relative to it
    assert Path(proj, seen["ckpt"]) == Path(proj, seen["run"], "checkpoints")
    assert Path(proj, seen["run"]).parent == proj / "runs"
    assert not seen["ckpt_exists"]  # named, not created: the script makes it


def test_the_example_saves_on_a_stop_in_the_ckpt_dir_and_resumes_from_it(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "examples" / "plain_torchrun" / "preemptible.py", proj / "train.py")
    (proj / "ddpkit.toml").write_text(
        'name = "snap"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'
        'args = ["--steps", "100000", "--step-s", "0.05"]\n'
    )
    job = subprocess.Popen(
        [DDPKIT, "run"], cwd=proj, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        for line in job.stdout:
            if "started at step 0" in line:
                break
        time.sleep(2)  # a few steps
        assert ddpkit(proj, "cancel", "local").returncode == 0
        out, _ = job.communicate(timeout=120)
    finally:
        job.kill()
    ckpt = proj / "runs" / "snap" / "checkpoints" / "ckpt.pt"
    assert ckpt.is_file(), out
    import torch

    step = torch.load(ckpt)["step"]
    assert step > 0, out
    again = ddpkit(proj, "run", "--", "--steps", str(step + 2))
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"rank 0: started at step {step}" in again.stdout, again.stdout
