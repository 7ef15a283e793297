"""sbatch rendering: goldens (exact), shellcheck + bash -n, inert values, what a node runs.

Regenerate goldens only on purpose:
DDPKIT_UPDATE_GOLDENS=1 pytest tests/unit/backends/test_slurm_render.py

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_slurm_render.py. Helpers both use are in
tests/unit/backends/test_slurm_render.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.slurm import backend as slurm
from ddpkit.tools.jobspec import load_spec
from ddpkit.train import goodput

from tests.conftest import FakeBin
from tests.unit.backends.test_slurm_render import REPO, recording_fake, run_node_script, shellcheck

PAYLOADS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "a\ntouch PWNED",
    "x;touch PWNED",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_values_are_inert(payload: str, tmp_path: Path) -> None:
    spec = load_spec(None, [f"env.X={payload}", "slurm.container_mounts=['/a:/a']",
                            "script=user/train.py"], 2, 2, train_args=["--x", payload])  # fmt: skip
    spec.image = payload  # images are only checked for a leading '-': quoting must hold
    spec.slurm.image_cache = payload
    for container in ("none", "pyxis", "apptainer"):
        spec.slurm.container = container
        shellcheck(slurm.render(spec), tmp_path)
    spec.slurm.container = "none"
    rc, rec = run_node_script(spec, tmp_path)
    assert rc == 0 and not (tmp_path / "PWNED").exists()
    assert rec["env"]["X"] == payload
    argv = rec["argv"]
    assert argv[argv.index("--") + 1 :] == ["user/train.py", "--x", payload]


def run_teardown(tmp_path: Path, step_rc: int, *sets: str) -> tuple[int, str]:
    recording_fake(tmp_path, "scontrol")
    script = f"(exit {step_rc})\n" + slurm.teardown_script(load_spec(None, list(sets)))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "42",
           "DDPKIT_LAUNCH_ID": "ddpkit-42-0", "PYTHONPATH": str(REPO)}  # fmt: skip
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=False)  # fmt: skip
    return out.returncode, out.stderr


# After a requeue (the update runs only once `scontrol requeue` succeeded): its start in
# slurm.requeue_delay_s (default 15) instead of SLURM's hold of about 2 minutes.
RELEASED = ["update", "JobId=42", "StartTime=now+15"]


def test_teardown_requeues_only_for_this_attempt(tmp_path: Path) -> None:
    # a stale requeue.json beside a crash no longer fakes a save
    marker = tmp_path / "runs" / "default" / "requeue.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"launch_id": "ddpkit-42-0-earlier", "time": 1}))
    # a crash this attempt's records blame on the user's code: never requeued
    run_dir = marker.parent
    goodput.record(run_dir, "end", launch="ddpkit-42-0", rank=1, code=1, cause="code")
    rc, err = run_teardown(tmp_path, 1)
    assert rc == 1 and "rank 1 failed in its own code: not requeued" in err, err
    assert json.loads((tmp_path / "scontrol.json").read_text())["argv"][0] == "show"
    shutil.rmtree(run_dir / goodput.GOODPUT_DIR)  # a lost node or a killed worker: requeued
    rc, err = run_teardown(tmp_path, 137)
    assert rc == 137 and "step exit 137 (a lost node" in err and "requeue 1 of 3" in err, err
    assert "this attempt saved" not in err  # the stale marker fakes no save
    assert json.loads((tmp_path / "scontrol.json").read_text())["argv"] == RELEASED
    rc, err = run_teardown(tmp_path, 75)
    assert rc == 75 and "requeue 1 of 3" in err
    assert json.loads((tmp_path / "scontrol.json").read_text())["argv"] == RELEASED
    rc, err = run_teardown(tmp_path, 75, "slurm.requeue_delay_s=none")  # SLURM's own hold
    assert rc == 75 and "requeue 1 of 3" in err and "did not take" not in err, err
    assert json.loads((tmp_path / "scontrol.json").read_text())["argv"] == ["requeue", "42"]
    # srun killed a node after another exited 75: this attempt's marker still requeues
    (tmp_path / "scontrol.json").unlink()
    marker.write_text(json.dumps({"launch_id": "ddpkit-42-0", "time": 1}))
    rc, err = run_teardown(tmp_path, 143)
    assert rc == 75 and "step exit 143, but this attempt saved" in err
    assert (tmp_path / "scontrol.json").exists()


def test_the_teardown_adds_a_twice_failed_node_to_the_jobs_own_exclusions(tmp_path: Path) -> None:
    """A user's `--exclude` (extra_sbatch) stays in ExcNodeList when the requeue adds the node
    that failed twice (before, the update replaced it: the job could go back to a node its
    user had left out)."""
    run_dir = tmp_path / "runs" / "default"
    for launch, t in (("ddpkit-42-0", 0), ("ddpkit-42-1", 10)):  # c2 lost twice: never ends
        for node in ("c1", "c2"):
            goodput.record(run_dir, "attempt", time=t, launch=launch, node=node)
        goodput.record(run_dir, "end", time=t + 5, launch=launch, node="c1", rank=0, code=143)
    calls = tmp_path / "calls"
    FakeBin(tmp_path / "bin").add(
        "scontrol",
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'if [ "$2" = hostnames ]; then echo gpu7; echo gpu8; exit 0; fi\n'
        'if [ "$1" = show ]; then echo "JobId=42 JobState=RUNNING Requeue=1 Restarts=1 '
        'ExcNodeList=gpu[7-8] NodeList=c2"; fi\n',
    )
    script = "(exit 137)\n" + slurm.teardown_script(load_spec(None, []))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "42",
           "SLURM_RESTART_COUNT": "1", "DDPKIT_LAUNCH_ID": "ddpkit-42-1",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert "requeue 2 of 3, excluding c2" in out.stderr, out.stderr
    said = calls.read_text().splitlines()
    update = "update JobId=42 ExcNodeList=gpu[7-8],c2 StartTime=now+15"
    assert said[-2:] == ["requeue 42", update], said


@pytest.mark.parametrize(
    "shown",
    ["JobState=COMPLETING Reason=None Requeue=1",  # a plain scancel, as SLURM 22.05 shows it
     "JobState=CANCELLED Reason=None Requeue=1",  # (from the batch shell: COMPLETING)
     "JobState=COMPLETING Reason=None Requeue=0",  # `ddpkit cancel`: the flag cleared first
     "JobState=RUNNING Reason=None Requeue=0"],
)  # fmt: skip
@pytest.mark.parametrize("rc", [75, 137])
def test_a_cancelled_job_is_never_requeued_by_its_teardown(
    tmp_path: Path, shown: str, rc: int
) -> None:
    """While the batch shell runs, a scancelled job shows COMPLETING (a CI run requeued one
    whose teardown looked for CANCELLED): neither a step that saved and exited 75 nor one
    that failed requeues it. The same step with the job still RUNNING does requeue."""
    requeued = tmp_path / "requeued"
    state = tmp_path / "state"
    FakeBin(tmp_path / "bin").add(
        "scontrol",
        f'#!/bin/sh\nif [ "$1" = requeue ]; then touch {requeued}; exit; fi\n'
        f'[ "$1" = update ] && exit 0\necho "JobId=42 JobName=x $(cat {state}) Restarts=0"\n',
    )
    script = f"(exit {rc})\n" + slurm.teardown_script(load_spec(None, []))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "42",
           "DDPKIT_LAUNCH_ID": "ddpkit-42-0", "PYTHONPATH": str(REPO)}  # fmt: skip

    def teardown(job: str) -> str:
        state.write_text(job)
        requeued.unlink(missing_ok=True)
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=False).stderr  # fmt: skip

    err = teardown(shown)
    assert not requeued.exists(), err
    if rc == 75:
        assert "the job was cancelled, so it is not requeued" in err, err
    err = teardown("JobState=RUNNING Reason=None Requeue=1")
    assert requeued.exists(), err  # the control: a job nobody ended is requeued


def test_render_cli_writes_file_into_the_workspace(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpkit", "render", "slurm", "--write", "--nodes", "2",
         "--set", "name=render-cli-test"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = tmp_path / ".ddpkit" / "rendered" / "slurm" / "render-cli-test.sbatch"
    assert path.read_text() == out.stdout
    assert ".ddpkit/rendered/slurm/render-cli-test.sbatch" in out.stderr


def test_node_script_runs_the_node_launcher_with_the_rendezvous(tmp_path: Path) -> None:
    spec = load_spec(REPO / "configs/default.toml", ["debug=trace"], 2, 3)
    rc, rec = run_node_script(spec, tmp_path, node_id="1")
    argv, env = rec["argv"], rec["env"]
    assert rc == 0
    assert argv[:2] == ["-m", "ddpkit.train.node"]
    assert argv[argv.index("--") + 1 :] == ["-m", "ddpkit.train", *spec.train_argv()]
    for flag in ("--nnodes=2", "--nproc-per-node=3", "--rdzv-backend=c10d", "--max-restarts=3"):
        assert flag in argv
    assert argv[argv.index("--shutdown-timeout") + 1] == "30"
    assert env["PET_RDZV_ENDPOINT"] == "10.1.2.3:20042"
    assert env["PET_RDZV_ID"] == "ddpkit-42-0" and env["PET_RDZV_CONF"] == "is_host=0"
    assert env["NCCL_DEBUG"] == "TRACE" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    _, rec0 = run_node_script(spec, tmp_path, node_id="0")
    assert rec0["env"]["PET_RDZV_CONF"] == "is_host=1"
    # one node: --standalone, no rendezvous variables (no port to collide on)
    _, one = run_node_script(load_spec(None, [], 1, 2), tmp_path)
    assert "--standalone" in one["argv"] and "PET_RDZV_ENDPOINT" not in one["env"]
