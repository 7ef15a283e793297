"""Goodput under a fixed failure schedule (`python -m bench --only goodput`).

A short local job (the kit's trainer, 2 gloo ranks on this machine) meets each failure kind
once, through the drill's own machinery (ddpkit.tools.chaos), one after the other recovered:

    kill-rank   SIGKILL rank 1             -> torchrun restarts the group in place
    stop-rank   SIGSTOP rank 0 (a hang)    -> its peer's collective times out, restart in place
    kill-node   SIGKILL the node launcher and its workers -> the job is gone; this benchmark
                then does what the scheduler does (SLURM's requeue, a recreated pod): it
                submits the same job again, which resumes from the newest checkpoint

The report is the run's goodput (train/goodput.py) and, per failure kind, the time lost
against the issue's goals: an in-place restart costs at most IN_PLACE_GOAL_S plus the steps
since the last save; a requeue at most REQUEUE_EXTRA_S more. Numbers are printed, never
asserted.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import BenchError, table, write_json

IN_PLACE_GOAL_S = 15.0  # detection + restart + checkpoint load of an in-place restart
REQUEUE_EXTRA_S = 45.0  # a requeue's extra allowance over an in-place restart

JOB = """\
name = "goodput"
nproc_per_node = 2
accelerator = "cpu"
[train]
model = "mlp"
steps = {steps}
batch_size = 16
log_interval = 10
ckpt_interval = {ckpt}
eval = false
stop_check_s = 0
timeout_s = 10          # a rank stopped this long is a hang
shutdown_timeout_s = 3  # then the stopped rank gets its SIGKILL this soon
"""


def schedule(quick: bool) -> tuple[int, int, list[str]]:
    """(steps, checkpoint interval, injections): each kind once, spaced by the steps."""
    if quick:
        return 900, 50, ["kill-rank@step=150:rank=1", "stop-rank@step=350:rank=0",
                         "kill-node@step=550:node=0"]  # fmt: skip
    return 3000, 100, ["kill-rank@step=500:rank=1", "stop-rank@step=1200:rank=0",
                       "kill-node@step=1900:node=0"]  # fmt: skip


def _submit(work: Path, log: Any) -> subprocess.Popen:
    """`ddpkit submit local --wait` of the job in `work`, its output to `log` (a file: a
    pipe nobody reads while the drill runs would fill and stop the job)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDPKIT_FAULT")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "ddpkit.cli", "submit", "local", "--wait"]
    return subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_drill(work: Path, quick: bool, say: Any = print) -> dict[str, Any]:
    """The job, its failures and its requeue; returns the goodput report as a dict."""
    from ddpkit.tools import chaos
    from ddpkit.train import goodput

    steps, ckpt, plan_text = schedule(quick)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "ddpkit.toml").write_text(JOB.format(steps=steps, ckpt=ckpt))
    run_dir = work / "runs" / "goodput"
    plan = [chaos.Injection.parse(t, random.Random(0)) for t in plan_text]
    t0 = time.time()
    with (work / "job.log").open("w") as log:
        job = _submit(work, log)
        try:
            chaos.drill(run_dir, plan, alive=lambda: job.poll() is None, say=say)
            job.wait(timeout=600)
            if job.returncode != 0:  # the node was lost: the scheduler's requeue, played here
                say(f"goodput: the job ended with {job.returncode} (its node lost): requeued")
                job = _submit(work, log)
                job.wait(timeout=600)
        finally:
            if job.poll() is None:
                job.kill()
    if job.returncode != 0:
        tail = (work / "job.log").read_text()[-3000:]
        raise BenchError(f"the goodput job failed ({job.returncode}): {tail}")
    rep = goodput.write_report(run_dir)
    if rep is None:
        raise BenchError(f"no goodput records in {run_dir}")
    return {"wall_s": time.time() - t0, "schedule": plan_text, "steps": steps,
            "ckpt_interval": ckpt, "report": rep.to_dict(), "table": rep.table()}  # fmt: skip


def goal_s(kind: str) -> float:
    """Detection + restart + load the goals allow a failure of `kind` (its redone steps aside)."""
    return IN_PLACE_GOAL_S + (REQUEUE_EXTRA_S if kind == "node lost" else 0.0)


def run(quick: bool, work: Path, out: Path, env: dict) -> list[str]:
    """The benchmark: its JSON in out/goodput.json, its lines for the summary."""
    res = run_drill(work / "goodput", quick)
    shutil.rmtree(work / "goodput", ignore_errors=True)
    write_json(out / "goodput.json", {"env": env, **res})
    rep = res["report"]
    rows = [["failure", "rank", "node", "detect s", "restart s", "load s", "redo s",
             "lost s", "goal s (+ redo)", "met"]]  # fmt: skip
    for f in rep["failures"]:
        fixed = f["detect_s"] + f["restart_s"] + f["load_s"]
        goal = goal_s(f["kind"])
        rows.append(
            [f["kind"], "-" if f["rank"] is None else str(f["rank"]), f["node"] or "-",
             *(f"{f[k]:.1f}" for k in ("detect_s", "restart_s", "load_s", "recompute_s")),
             f"{f['lost_s']:.1f}", f"{goal:.0f}", "yes" if fixed <= goal and f["recovered"] else "NO"]
        )  # fmt: skip
    good = rep["goodput"]
    return [
        f"== goodput: {res['steps']} steps, 2 gloo ranks, a save every {res['ckpt_interval']} "
        f"steps; one each of {', '.join(res['schedule'])} ==",
        f"goodput {good:.0%} over {rep['wall_s']:.0f} s wall ({rep['productive_s']:.0f} s "
        f"productive, {rep['startup_s']:.0f} s start-up, {rep['ckpt_blocking_s']:.1f} s saves "
        f"blocking, {rep['attempts']} attempts); {len(rep['failures'])} failures, "
        f"{rep['lost_s']:.0f} s lost"
        if good is not None
        else "goodput unknown (no ready/save records)",
        table(rows),
        f"goal: an in-place restart costs <= {IN_PLACE_GOAL_S:.0f} s (detect + restart + load) "
        f"plus the steps since the last save; a requeue <= {REQUEUE_EXTRA_S:.0f} s more",
    ]
