"""Goodput accounting (train/goodput.py): the report's arithmetic from records, and a real
torchrun job through the node launcher whose worker is SIGKILLed mid-run.

Here the tests that start processes; the in-process ones in tests/unit/train/test_goodput.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ddpkit.train import goodput

from tests.trainrun import PY, ROOT, clean_env

ARGS = (
    "--progress", "plain", "--stop-check-s", "0", "--steps", "12", "--batch-size", "16",
    "--log-interval", "3", "--ckpt-interval", "3", "--synthetic-samples", "1024", "--no-eval",
)  # fmt: skip


def _launch(run_dir: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The node launcher over 2 ranks of ARGS (in-place restarts allowed) into run_dir."""
    env = clean_env(**({"DDPKIT_FAULT": fault} if fault else {}))
    cmd = [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "2", "--", "-m", "ddpkit.train", "--run-dir", str(run_dir),
           *ARGS, *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One run whose rank 1 SIGKILLs itself before step 8, restarted in place: read by the
    report test, and copied as the earlier run of the reused-run-dir test (one launch of 2
    ranks, each importing torch, instead of two). That test's `--resume never` run, the same
    ARGS on 2 ranks unbroken, is also the reference its parameters must equal bitwise."""
    run_dir = tmp_path_factory.mktemp("goodput") / "run"
    return run_dir, _launch(run_dir, fault="kill@8:1")


@pytest.mark.slow
def test_a_killed_worker_restarts_in_place_and_the_report_lists_it(killed_run):
    run_dir, p = killed_run
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-6")  # the newest complete checkpoint
    # its parameters equal an unbroken run's: the reused-run-dir test's fresh run is that run
    rep = summary["goodput"]
    assert rep["attempts"] == 2 and rep["finished"]
    (kill,) = rep["failures"]
    assert (kill["kind"], kill["rank"], kill["recovered"]) == ("killed", 1, True)
    assert kill["load_s"] > 0 and kill["recompute_s"] > 0  # resumed at step 6, killed at 8
    assert 0 < rep["productive_s"] < rep["wall_s"]
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "loss" in last and "goodput" not in last  # metrics.jsonl stays the steps' records
    after = json.loads((run_dir / goodput.REPORT_FILE).read_text())  # the launcher's, at exit
    assert after["failures"][0]["kind"] == "killed"
    assert f"ddpkit: goodput {after['goodput']:.0%}: 1 failure, " in p.stderr


@pytest.mark.slow
def test_a_run_dir_reused_with_resume_never_reports_only_the_new_run(killed_run, tmp_path):
    """A run with a killed worker, then `--resume never` in the same run dir: the second
    run's summary, goodput.json and launcher line hold none of the first run's failure. The
    second run is the first one's unbroken twin (the same ARGS on 2 ranks): the killed run,
    resumed in place from step 6, ends with its parameters bitwise."""
    run_dir = tmp_path / "run"
    shutil.copytree(killed_run[0], run_dir)  # the first run: a killed worker, restarted
    assert killed_run[1].returncode == 0, killed_run[1].stderr[-3000:]
    killed = json.loads((killed_run[0] / "summary.json").read_text())
    first = json.loads((run_dir / goodput.REPORT_FILE).read_text())
    assert [f["kind"] for f in first["failures"]] == ["killed"] and first["attempts"] == 2
    p = _launch(run_dir, "--resume", "never")
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["resumed_from"]
    assert summary["steps"] == killed["steps"] == 12
    assert killed["param_digest"] == summary["param_digest"]  # the unbroken run's parameters
    rep = summary["goodput"]
    assert rep["failures"] == [] and rep["attempts"] == 1 and rep["finished"]
    assert rep["wall_s"] < first["wall_s"] + 60
    assert "ddpkit: goodput" not in p.stderr  # one attempt: no goodput line (68b59f4)
