"""End to end on a real 2-node SLURM cluster (the `slurm_cluster` fixture starts one).

1. `make slurm-submit NODES=2 GPUS=2 WAIT=1`: 2 nodes x 2 gloo processes train, checkpoint,
   write summary.json (world size 4), exit 0.
2. Preemption: `scancel --signal=USR1` on a running 2-node job: it saves, exits 75, the
   batch shell requeues it, it resumes from the checkpoint and finishes with the same
   parameter digest as an uninterrupted run (the `reference` fixture here). The drill runs
   once, with its checkpoints in the S3 store (tests/engines/slurm/test_slurm_s3.py); the
   requeue of a job whose checkpoints are on the shared disk, to the same digest, is
   test_slurm_recovery's lost node. At 2 nodes x 1 process: with two ranks an allreduce sum
   is exact whatever its order, while at 4 ranks DDP's bucket rebuild after a resume
   reorders gloo's ring sums for one step (last-bit differences, seen here).
Budget: about 1 min for 1 on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm_fixtures import scontrol, slurm_cluster, until_done  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_file(tmp_path: Path, name: str) -> Path:
    """The default job, shortened, with its outputs under tmp_path (a shared filesystem)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nrdzv_port = {free_port()}\ntime = "00:15:00"\n'
        "[train]\n"
        f'model = "mlp"\ndataset = "synthetic"\nparallel = "ddp"\nbatch_size = 64\n'
        f'steps = {STEPS}\nlr = 1e-3\nwarmup_steps = 20\nlr_decay = "cosine"\n'
        f'log_interval = 10\nckpt_interval = 100\nrun_dir = "{tmp_path / name}"\n'
    )
    return path


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster: int, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    tmp = tmp_path_factory.mktemp("slurm-e2e")
    cfg = job_file(tmp, "e2e-straight")
    out = subprocess.run(
        ["make", "-s", "-o", str(REPO / ".venv/.installed"), "slurm-submit", f"CONFIG={cfg}", "NODES=2",
         "GPUS=2", "WAIT=1"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return {"rc": out.returncode, "out": out.stdout + out.stderr, "run": tmp / "e2e-straight"}


def test_make_slurm_submit_trains_on_two_nodes(uninterrupted: dict) -> None:
    assert uninterrupted["rc"] == 0, uninterrupted["out"][-4000:]
    run = uninterrupted["run"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["steps"] == STEPS
    assert summary["final_loss"] < summary["first_loss"]
    for step in (100, 200, 300):
        assert (run / "checkpoints" / f"step-{step}" / ".complete").exists()
    logs = sorted(p.name for p in (run / "slurm").glob("*_log.out"))
    assert len({n.split("_")[1] for n in logs}) == 2, logs  # one log per node
    assert "submitted job" in uninterrupted["out"] and "COMPLETED" in uninterrupted["out"]


def submit(cfg: Path, *extra: str) -> str:
    sub = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "ddpkit.tools.submit", "submit", "slurm",
         "--config", str(cfg), "--nodes", "2", "--gpus", "1", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return sub.stdout.split("submitted job ", 1)[1].split()[0]


_REFERENCE: dict = {}
_REFERENCE_RUN: list[Path] = []  # its run dir, for diverged()


def diverged(run: Path) -> str:
    """Why a run's digest differs from the reference's, for the assertion's message: the
    first logged step whose loss or grad norm differs (attempts in order), and the steps it
    resumed at. A difference before the resume means two runs of one job computed
    differently (test_slurm_s3 in d67e86c's CI, and 1 of 14 loaded runs of it here), after it
    the resume did."""

    def logged(path: Path) -> list[tuple[int, float, float | None]]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [(r["step"], r["loss"], r.get("grad_norm")) for r in rows if "lr" in r]

    ref = {step: rest for step, *rest in logged(_REFERENCE_RUN[0] / "metrics.jsonl")}
    first = next(
        (s for s, *rest in logged(run / "metrics.jsonl") if s in ref and ref[s] != rest), None
    )
    logs = "".join(p.read_text() for p in sorted((run / "slurm").glob("*_log.out")))
    resumed = sorted({int(n) for n in re.findall(r"resumed from \S+ at step (\d+)", logs)})
    return (
        f"the logged loss or grad norm first differs from the reference's at step {first}; "
        f"resumed at step {resumed}"
    )


@pytest.fixture
def reference(slurm_cluster: int, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """summary.json of an uninterrupted 2 x 1 run of job_file's job: the digest every
    interrupted job of these tests must end with. Submitted once per pytest run, by the first
    test that asks (test_slurm_recovery and test_slurm_s3: each submitted its own copy of
    the same job before)."""
    if not _REFERENCE:
        tmp = tmp_path_factory.mktemp("slurm-reference")
        submit(job_file(tmp, "reference"), "--wait")
        _REFERENCE.update(json.loads((tmp / "reference" / "summary.json").read_text()))
        _REFERENCE_RUN[:] = [tmp / "reference"]
    return _REFERENCE


def test_a_users_cancel_ends_the_job_without_a_requeue(slurm_cluster: int, tmp_path: Path) -> None:  # noqa: F811
    """`ddpkit cancel slurm` (make slurm-cancel) of a running job: scancel's SIGTERM makes
    the trainer save and stop, and the job stays cancelled; a second cancel says so."""
    cfg = job_file(tmp_path, "e2e-cancel")
    run = tmp_path / "e2e-cancel"
    job = submit(cfg)
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert time.monotonic() < deadline, "the job never reached step 20"
            time.sleep(0.5)
        ddpkit = [str(REPO / ".venv/bin/ddpkit"), "cancel", "slurm", job]
        out = subprocess.run(ddpkit, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"cancelled job {job}" in out.stdout, out.stdout + out.stderr
        deadline = time.monotonic() + 120
        while (info := scontrol(job))["JobState"] not in ("CANCELLED", "COMPLETED", "FAILED"):
            assert time.monotonic() < deadline, info
            assert info.get("Restarts", "0") == "0", info  # never requeued
            time.sleep(1)
        time.sleep(3)  # a requeue would show up as PENDING with Restarts=1 right after
        info = scontrol(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    assert info["JobState"] == "CANCELLED" and info.get("Restarts", "0") == "0", info
    again = subprocess.run(ddpkit, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already ended (cancelled)" in again.stdout, again.stdout


def script_job(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A user's project whose script uses ddpkit.train.preempt (the example), slowed down."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "examples" / "plain_torchrun" / "preemptible.py", proj / "train.py")
    cfg = proj / "ddpkit.toml"
    cfg.write_text(
        f'name = "{name}"\nrdzv_port = {free_port()}\ntime = "00:15:00"\naccelerator = "cpu"\n'
        'script = "train.py"\nargs = ["--steps", "100000", "--step-s", "0.05", "--out", '
        f'"{proj / "out" / "result.json"}"]\n'
    )
    (proj / "out").mkdir()
    return cfg, proj / "runs" / name


def wait_until_gone_or_back(job: str, timeout: float) -> dict[str, str]:
    """The job's last record once SLURM has finished with it (no longer in squeue), or at
    once should it come back (requeued: Restarts > 0)."""
    deadline = time.monotonic() + timeout
    while True:
        info = scontrol(job)
        if info.get("Restarts", "0") != "0":
            return info
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
        if not queued.stdout.strip():
            return info
        assert time.monotonic() < deadline, info
        time.sleep(1)


@pytest.mark.parametrize("entry", ["trainer", "script"])
def test_a_plain_scancel_ends_the_job_with_its_save_and_no_requeue(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
    entry: str,
) -> None:
    """`scancel JOBID`, no flags, as users and admins type it: SIGTERM. The entry point
    saves on the way out (the kit's trainer, or a user's script through ddpkit.train.preempt)
    and the job ends CANCELLED, never requeued: only the --signal the kit asks SLURM for
    before the time limit requeues (test_slurm_s3.py's preempted job)."""
    if entry == "trainer":
        cfg, run = job_file(tmp_path, "e2e-scancel"), tmp_path / "e2e-scancel"
        started = lambda: len(_lines(run / "metrics.jsonl")) >= 3  # noqa: E731
    else:
        cfg, run = script_job(tmp_path, "e2e-scancel-script")
        started = lambda: "started at step" in _logs(run, job)  # noqa: E731
    job = submit(cfg)
    try:
        deadline = time.monotonic() + 240
        while not started():
            assert time.monotonic() < deadline, (scontrol(job), _logs(run, job))
            assert scontrol(job)["JobState"] in ("PENDING", "RUNNING"), scontrol(job)
            time.sleep(0.5)
        subprocess.run(["scancel", job], check=True)
        info = wait_until_gone_or_back(job, 150)
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = _logs(run, job)
    assert info["JobState"] == "CANCELLED" and info.get("Restarts", "0") == "0", (info, logs)
    assert "requeue 1 of" not in logs and not (run / "requeue.json").exists(), logs
    if entry == "trainer":  # saved on the way out: a step before the first interval's
        saved = [p.parent.name for p in (run / "checkpoints").glob("step-*/.complete")]
        assert saved and all(int(n.split("-")[1]) < 100 for n in saved), (saved, logs)
        assert "stopped by SIGTERM" in logs and "exiting 75" not in logs, logs
    else:
        assert (run / "checkpoints" / "ckpt.pt").is_file(), logs  # $DDPKIT_CKPT_DIR
        assert "rank 0: stop at step" in logs, logs


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _logs(run: Path, job: str) -> str:
    return "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))


def test_plain_torchrun_script_on_two_nodes_world_size_4(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The unchanged plain DDP script through `make slurm-submit NODES=2`."""
    out = tmp_path / "result.json"
    proj = tmp_path / "plain-project"  # the example as a project of its own (its workspace)
    shutil.copytree(REPO / "examples" / "plain_torchrun", proj)
    sub = subprocess.run(
        ["make", "-s", "-o", str(REPO / ".venv/.installed"), "slurm-submit",
         f"CONFIG={proj / 'job.toml'}", "NODES=2", "GPUS=2", "WAIT=1",
         f"ARGS=--out {out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 4 and result["last_loss"] < result["first_loss"] / 100
    # --wait follows every node's log, prefixed by its host (rank 0 may sit on either node)
    hosts = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    label = re.search(r"^\[([^\]]+)\] rank 0: world size 4", sub.stdout, re.M)
    assert label and label[1] in hosts.stdout.split(), (hosts.stdout, sub.stdout)


def test_plain_sbatch_of_the_rendered_file(slurm_cluster: int, tmp_path: Path) -> None:  # noqa: F811
    """`sbatch` of the rendered script works although its log dir does not exist yet, and the
    head is found by NodeAddr (node names need not resolve)."""
    cfg = job_file(tmp_path, "e2e-sbatch")
    script = tmp_path / "job.sbatch"
    render = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "ddpkit.tools.submit", "render", "slurm", "--config",
         str(cfg), "--nodes", "2", "--gpus", "1", "--set", "accelerator=cpu",
         "--set", "train.steps=20", "--set", f"slurm.venv={REPO / '.venv'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    script.write_text(render.stdout)
    run = tmp_path / "e2e-sbatch"
    assert not (run / "slurm").exists()
    sub = subprocess.run(["sbatch", "--parsable", str(script)], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while (info := scontrol(job))["JobState"] in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, info
        time.sleep(1)
    batch_log = REPO / f"slurm-e2e-sbatch-{job}.out"
    try:
        assert info["JobState"] == "COMPLETED", (info, batch_log.read_text())
        assert json.loads((run / "summary.json").read_text())["world_size"] == 2
        assert sorted(p.name for p in (run / "slurm").glob(f"{job}_*_log.out")) == [
            f"{job}_0_log.out", f"{job}_1_log.out"]  # fmt: skip
    finally:
        batch_log.unlink(missing_ok=True)


def test_sweep_is_one_job_array_with_a_run_dir_per_member(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    """--sweep train.lr=... as ONE SLURM job array through submitit; each member
    runs in its own run dir (runs/<name>-<i> under the submit directory, here tmp_path)."""
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f'name = "e2e-sweep"\naccelerator = "cpu"\ntime = "00:10:00"\n'
        f'[slurm]\nlog_dir = "{tmp_path / "sweep-logs"}"\nvenv = "{REPO / ".venv"}"\n'
        "[train]\nsteps = 20\nlog_interval = 10\nckpt_interval = 0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the submit dir is not the repository
    sub = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "ddpkit.tools.submit", "submit", "slurm",
         "--config", str(cfg), "--nodes", "1", "--gpus", "1",
         "--sweep", "train.lr=1e-3,3e-4", "--wait"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert "submitted job array" in sub.stdout
    ids = [ln.split(":")[0].strip() for ln in sub.stdout.splitlines() if ln.startswith("  ")]
    assert len(ids) == 2 and len({i.split("_")[0] for i in ids}) == 1  # one array
    runs = [tmp_path / "runs" / f"e2e-sweep-{i}" for i in (0, 1)]
    assert [json.loads((r / "config.json").read_text())["lr"] for r in runs] == [1e-3, 3e-4]
    assert all((r / "summary.json").exists() for r in runs)
