"""The save/restart budget before the queue (tools/savebudget.py): the save against the
scheduler's stop window, and the Young/Daly interval, from the job spec and a checkpoint on
disk; all in-process, no torch processes (the submitting process imports torch already:
k8s/render.py imports ddpkit.train.ckpt.store)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from ddpkit.k8s.backend import K8sBackend
from ddpkit.slurm.backend import SlurmBackend
from ddpkit.tools.jobspec import BUILTIN_JOB, SpecError, load_spec
from ddpkit.tools.savebudget import (
    DEFAULT_RANK_MTBF_H,
    budget_lines,
    job_mtbf_h,
    save_cost,
    young_daly_s,
)
from ddpkit.tools.submit import run
from ddpkit.train.contract import CKPT_MARKER


def _spec(tmp_path: Path, *sets: str, nodes: int = 1, gpus: int = 1):
    sets = (f"train.run_dir={tmp_path / 'run'}", *sets)
    return load_spec(BUILTIN_JOB, list(sets), nodes, gpus)


def _checkpoint(ckpt_dir: Path, step: int, nbytes: int, save_s: float) -> None:
    """A complete step dir as the checkpoint manager leaves it: DCP's .metadata, a data
    file, and the marker recording every file's size and the save's time."""
    d = ckpt_dir / f"step-{step}"
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"m")
    (d / "__0_0.distcp").write_bytes(b"\0" * (nbytes - 1))
    files = {
        ".metadata": {"bytes": 1, "crc32": "0"},
        "__0_0.distcp": {"bytes": nbytes - 1, "crc32": "0"},
    }
    (d / CKPT_MARKER).write_text(json.dumps({"step": step, "save_s": save_s, "files": files}))


def test_young_daly_is_sqrt_2cm():
    # 18 s saves, a failure every 8 h: sqrt(2 * 18 * 28800) = 1018 s, about 17 min
    assert young_daly_s(18.0, 8 * 3600) == pytest.approx(1018.23, abs=0.01)
    assert young_daly_s(0.0, 3600) == 0.0
    # four times the save cost doubles the interval
    assert young_daly_s(72.0, 8 * 3600) == pytest.approx(2 * young_daly_s(18.0, 8 * 3600))


def test_default_failure_rate_scales_with_ranks():
    assert job_mtbf_h(None, 1024) == (8.0, "mtbf_h unset: 8192 h / 1024 ranks")
    assert job_mtbf_h(None, 1)[0] == DEFAULT_RANK_MTBF_H
    assert job_mtbf_h(3.5, 1024) == (3.5, "mtbf_h")


def test_measured_save_gives_size_and_speed(tmp_path):
    spec = _spec(tmp_path)
    ckpt = Path(spec.checkpoint_dir)
    _checkpoint(ckpt, 10, 2_000_000, 0.5)
    _checkpoint(ckpt, 20, 4_000_000, 2.0)  # the newest: 4 MB in 2 s = 0.002 GB/s
    (ckpt / "step-30").mkdir()  # an interrupted save (no marker) is skipped
    cost = save_cost(spec, None)
    assert (cost.nbytes, cost.size_from) == (4_000_000, "measured, step-20")
    assert (cost.gbps, cost.speed_from) == (pytest.approx(0.002), "measured, step-20")
    assert cost.seconds == pytest.approx(2.0)
    # the dry run's size wins over an old checkpoint's; the configured speed over the measured
    spec = _spec(tmp_path, "ckpt_write_gbps=0.01")
    cost = save_cost(spec, 50_000_000)
    assert (cost.nbytes, cost.gbps, cost.speed_from) == (50_000_000, 0.01, "ckpt_write_gbps")
    assert cost.seconds == pytest.approx(5.0)


def test_lines_fit_and_not_fit_the_window(tmp_path):
    spec = _spec(tmp_path, "ckpt_write_gbps=0.1", "mtbf_h=8", nodes=2)  # a 1 GB save: 10 s
    window = SlurmBackend().stop_window(spec)
    assert window[0] == spec.shutdown_budget_s + 60  # the default lead time
    fit, interval = budget_lines(spec, window, 1_000_000_000)
    assert "a 1 GB checkpoint (the --plan dry run) at 0.1 GB/s (ckpt_write_gbps) takes ~10 s" in fit
    assert "fits the 90 s stop window" in fit
    assert "--signal=USR1@90" in fit and "30 s shutdown budget" in fit
    assert "sqrt(2 x 10 s x 8 h MTBF (mtbf_h)) = 13 min between saves" in interval
    assert math.isclose(young_daly_s(10, 8 * 3600) / 60, 12.65, abs_tol=0.01)

    slow = _spec(tmp_path, "ckpt_write_gbps=0.01")  # 100 s: past the 30 s shutdown budget
    fit, _ = budget_lines(slow, K8sBackend().stop_window(slow), 1_000_000_000)
    assert "does NOT fit the 30 s shutdown budget" in fit
    assert "raise train.shutdown_timeout_s" in fit
    longer = _spec(tmp_path, "ckpt_write_gbps=0.01", "train.shutdown_timeout_s=300")
    fit, _ = budget_lines(longer, K8sBackend().stop_window(longer), 1_000_000_000)
    assert "fits the 330 s stop window (the pods' terminationGracePeriodSeconds)" in fit


def test_unknown_size_is_one_line(tmp_path):
    spec = _spec(tmp_path)
    (line,) = budget_lines(spec, None)
    assert line.startswith("ddpkit: save budget: checkpoint size unknown (no checkpoint in ")
    assert "`--plan` measures the model" in line


def test_render_plan_prints_the_budget(tmp_path, capsys, monkeypatch):
    """`render slurm --plan`: the dry run's checkpoint size, in the launcher's own output."""
    monkeypatch.chdir(tmp_path)
    rc = run(["render", "slurm", "--plan", "-q", "--set", "mtbf_h=8",
              "--set", "ckpt_write_gbps=0.001"])  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert rc == 0
    budget = [x for x in err if x.startswith("ddpkit: save budget:")]
    interval = [x for x in err if x.startswith("ddpkit: checkpoint interval: Young/Daly")]
    assert len(budget) == 1 and len(interval) == 1, err
    assert " MB checkpoint (the --plan dry run) at 0.001 GB/s (ckpt_write_gbps)" in budget[0]
    assert "fits the 90 s stop window" in budget[0]


def test_bad_values_are_one_line(tmp_path):
    for key in ("mtbf_h=0", "ckpt_write_gbps=-1"):
        with pytest.raises(SpecError, match=r"must be a number > 0"):
            _spec(tmp_path, key)
