"""Logging backends, the progress bar, held-out eval, the profiler: read back what was written.

Here the tests that start processes; the in-process ones in
tests/unit/train/test_logging_backends.py."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainrun import ROOT, clean_env, train

HIDE = """
import runpy, sys
class Hide:  # the import system's answer for a package that is not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {pkg!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Hide())
sys.argv = ["train", *{args!r}]
runpy.run_module("train", run_name="__main__", alter_sys=True)
"""

STEPS = 4


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of the one offline W&B run under run_dir (its .wandb record log).

    The file is W&B's LevelDB-style log: a 7-byte header, 32 KiB blocks, each record a
    7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) then bytes of a
    wandb_internal_pb2.Record.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    raw, pos, buf, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        pos += 7
        if kind == 0:  # block padding
            pos += left - 7
            continue
        buf += raw[pos : pos + length]
        pos += length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                items = rec.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("logged") / "run"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": ""}
    run = train(
        run_dir,
        "--steps",
        str(STEPS),
        "--log-interval",
        "1",
        "--eval-interval",
        "2",
        "--tensorboard",
        "--log-to",
        "wandb,mlflow",
        "--profile-steps",
        "2-3",
        "--progress",
        "bar",
        nproc=2,
        env=env,
        timeout=400,
    )
    recs = run.metrics()
    return run, [r for r in recs if "loss" in r], [r for r in recs if "eval_loss" in r]


@pytest.mark.slow
def test_tensorboard_events_read_back(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, steps, evals = logged_run
    files = list((run.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1  # rank 0 only
    acc = EventAccumulator(str(run.run_dir / "tensorboard"))
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in loss] == list(range(1, STEPS + 1))
    assert [v for _, v in loss] == pytest.approx([r["loss"] for r in steps], rel=1e-6)
    assert [e.step for e in acc.Scalars("eval_loss")] == [2, 4]


@pytest.mark.slow
def test_wandb_offline_run_read_back(logged_run):
    run, steps, evals = logged_run
    rows = wandb_history(run.run_dir)  # exactly one run dir: rank 0 only (else ValueError)
    losses = {r["_step"]: r["loss"] for r in rows if "loss" in r}
    assert losses == pytest.approx({r["step"]: r["loss"] for r in steps}, rel=1e-6)
    assert {r["_step"]: r["eval_loss"] for r in rows if "eval_loss" in r} == pytest.approx(
        {e["step"]: e["eval_loss"] for e in evals}, rel=1e-6
    )


@pytest.mark.slow
def test_mlflow_sqlite_store_in_the_run_dir_read_back(logged_run):
    from mlflow.tracking import MlflowClient

    run, steps, _ = logged_run
    client = MlflowClient(f"sqlite:///{run.run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddpkit")
    (mrun,) = client.search_runs([exp.experiment_id])  # one run: rank 0 only
    hist = client.get_metric_history(mrun.info.run_id, "loss")
    assert [m.step for m in hist] == [r["step"] for r in steps]
    assert [m.value for m in hist] == pytest.approx([r["loss"] for r in steps], rel=1e-6)
    assert mrun.data.params["batch_size"] == "64" and mrun.data.params["steps"] == str(STEPS)


@pytest.mark.slow
def test_eval_interval_and_profile_and_bar(logged_run):
    run, steps, evals = logged_run
    assert [e["step"] for e in evals] == [2, 4]
    assert all(0 < e["eval_accuracy"] <= 1 and e["eval_loss"] > 0 for e in evals)
    for rank in (0, 1):
        trace = json.loads((run.run_dir / "profile" / f"trace-rank{rank}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"ddpkit_step_2", "ddpkit_step_3"} <= names
        assert not {"ddpkit_step_1", "ddpkit_step_4"} & names
    # tqdm: steps done/total, [elapsed<ETA, rate], the last metrics as its postfix
    assert re.search(rf"{STEPS}/{STEPS} \[\d\d:\d\d<\d\d:\d\d, +[\d.]+(s/step|step/s)", run.out)
    assert "eval at step 2: loss" in run.out


@pytest.mark.slow
def test_rerunning_a_finished_run_keeps_its_summary(logged_run):
    run, _, _ = logged_run
    before = (run.run_dir / "summary.json").read_bytes()
    again = train(run.run_dir, "--steps", str(STEPS))  # resumes at the last step
    assert "nothing left to train" in again.out and "summary.json kept" in again.out
    assert (run.run_dir / "summary.json").read_bytes() == before
    assert json.loads(before)["final_loss"] is not None


@pytest.mark.parametrize(
    "pkg,args,flag",
    [
        ("wandb", ["--log-to", "mlflow,wandb"], "--log-to wandb"),
        ("tensorboard", ["--tensorboard"], "--tensorboard"),
    ],
)
def test_a_missing_backend_package_is_one_line_before_anything_is_written(
    tmp_path, pkg, args, flag
):
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-c", HIDE.format(pkg=pkg, args=[*args, "--run-dir", str(run_dir)])],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr == (
        f"error: {flag} needs the {pkg} package, which is not installed: pip install {pkg} "
        f"(or pip install -e '.[logging]'), or drop {flag}\n"
    )
    assert not run_dir.exists()
