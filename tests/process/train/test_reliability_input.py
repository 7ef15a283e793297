"""Bad numbers and paths are one line, exit 2, nothing written;
under torchrun a config error is printed once (rank 0), not once per rank.

Here the tests that start processes; the in-process ones in
tests/unit/train/test_reliability_input.py. Helpers both use are in
tests/unit/train/test_reliability_input.py."""

from __future__ import annotations

import subprocess

import pytest

from tests.trainrun import ROOT, clean_env, torchrun_cmd
from tests.unit.train.test_reliability_input import _one_line, _train

# (flags, the one line's pattern). Each: exit 2, one line, no traceback, no run dir.
NUMBERS = [
    (["--lr", "inf"], r"--lr must be a finite number, got inf"),
    (["--lr", "nan"], r"--lr must be a finite number, got nan"),
    (["--clip-grad", "nan"], r"--clip-grad must be a finite number, got nan"),
    (["--min-lr-ratio", "-1"], r"--min-lr-ratio must be in \[0, 1\]"),
    (["--shutdown-timeout-s", "-1"], r"--shutdown-timeout-s must be > 0 seconds, got -1.0"),
    (["--peak-tflops", "-5"], r"--peak-tflops must be > 0, got -5.0"),
    (["--weight-decay", "-5"], r"--weight-decay must be >= 0, got -5.0"),
    (["--seed", str(2**70)], r"--seed must be in 0\.\.9223372036854775807"),
    (["--seed", "-1"], r"--seed must be in 0\.\."),
    (["--model", "gpt", "--n-head", "0"], r"--n-head must be >= 1, got 0"),
    (["--model", "gpt", "--seq-len", "0"], r"--seq-len must be >= 1, got 0"),
    (["--model", "gpt", "--vocab-size", "0"], r"--vocab-size must be >= 1, got 0"),
    (["--model", "gpt", "--d-model", "-64"], r"--d-model must be >= 1, got -64"),
    (["--synthetic-samples", "-5"], r"--synthetic-samples must be >= 1, got -5"),
    (["--synthetic-classes", "0"], r"--synthetic-classes must be >= 1, got 0"),
    (["--timeout-s", "nan"], r"--timeout-s must be a finite number, got nan"),
    (["--timeout-s", "inf"], r"--timeout-s must be a finite number, got inf"),
    (["--stop-check-s", "nan"], r"--stop-check-s must be a finite number, got nan"),
    (["--dropout", "1.5"], r"--dropout must be in \[0, 1\)"),
]
TOML = [
    ("batch_size = true", r"batch_size must be int, got true; booleans are not numbers"),
    ("lr = nan", r"--lr must be a finite number, got nan"),
    ("clip_grad = inf", r"--clip-grad must be a finite number, got inf"),
    ("seed = false", r"seed must be int, got false"),
]


@pytest.mark.parametrize("args,pattern", NUMBERS, ids=[" ".join(a) for a, _ in NUMBERS])
def test_bad_numbers(args, pattern, tmp_path):
    _one_line(_train("--run-dir", str(tmp_path / "r"), *args), pattern)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("line,pattern", TOML, ids=[x for x, _ in TOML])
def test_bad_numbers_in_toml(line, pattern, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(line + "\n")
    _one_line(_train("--config", str(cfg), "--run-dir", str(tmp_path / "r")), pattern)
    assert not (tmp_path / "r").exists()


def _torchrun(tmp_path, *args: str, env=None) -> subprocess.CompletedProcess:
    cmd = torchrun_cmd(2) + ["--run-dir", str(tmp_path / "r"), "--progress", "plain", *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=180
    )


def _worker_lines(out: str) -> list[str]:
    """error: lines and tracebacks, torchrun's own report of the failed workers left out."""
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    tracebacks = out.count("Traceback (most recent call last)") - out.count('torchrun", line')
    return errors + ["<worker traceback>"] * tracebacks


@pytest.mark.slow
def test_a_config_error_under_torchrun_is_printed_once(tmp_path):
    p = _torchrun(tmp_path, "--parallel", "fsdp", "--sharding", "HYBRID_SHARD",
                  "--replicate-degree", "3")  # fmt: skip
    assert p.returncode != 0 and "exitcode  : 2" in p.stderr
    assert _worker_lines(p.stdout + p.stderr) == [
        "error: HYBRID_SHARD: replicate degree 3 does not divide world size 2 (2 % 3 = 2); "
        "pass --replicate-degree one of 1, 2"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_user_error_on_one_rank_leaves_every_rank_quietly(tmp_path):
    p = _torchrun(tmp_path, "--steps", "8", "--batch-size", "16", "--synthetic-samples", "1024",
                  env={"DDPKIT_FAULT": "usererror@3:1"})  # fmt: skip
    assert p.returncode != 0 and "exitcode  : 2" in p.stderr
    assert _worker_lines(p.stdout + p.stderr) == ["error: injected user error on rank 1 at step 3"]


def test_a_rank_other_than_0_leaves_its_bad_config_to_rank_0(monkeypatch, capsys):
    """Under torchrun the first worker out makes the agent stop the rest: a rank that found
    the bad config before rank 0 waits for rank 0 to say it (up to a bound), and leaves at
    once when the agent's stop signal comes (rank 0 has exited); rank 0 does not wait."""
    import threading
    import time

    from ddpkit.train import __main__ as entry
    from ddpkit.train.config import ConfigError

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(entry, "_LET_RANK_0_SAY_S", 0.5)
    monkeypatch.setattr(entry.signals, "received", lambda: None)
    t0 = time.monotonic()
    assert entry._before_group(ConfigError("bad")) == 2
    assert 0.5 <= time.monotonic() - t0 < 3 and capsys.readouterr().err == ""

    stopped: list[int] = []  # the agent's SIGTERM, recorded 0.2 s in
    monkeypatch.setattr(entry.signals, "received", lambda: (15, 0.0) if stopped else None)
    monkeypatch.setattr(entry, "_LET_RANK_0_SAY_S", 60)
    threading.Timer(0.2, stopped.append, args=(15,)).start()
    t0 = time.monotonic()
    assert entry._before_group(ConfigError("bad")) == 2
    assert time.monotonic() - t0 < 10

    monkeypatch.setenv("RANK", "0")
    t0 = time.monotonic()
    assert entry._before_group(ConfigError("bad")) == 2
    assert time.monotonic() - t0 < 1 and capsys.readouterr().err == "error: bad\n"


@pytest.mark.parametrize(
    "flag,sub,pattern",
    [
        ("--ckpt-dir", "FILE", r"--ckpt-dir \S+/FILE is a file; pass a directory path"),
        ("--run-dir", "FILE", r"--run-dir \S+/FILE is a file; pass a directory path"),
        ("--run-dir", "FILE/sub", r"--run-dir \S+/FILE/sub is under \S+/FILE, a file"),
    ],
)
def test_paths_that_cannot_be_directories(flag, sub, pattern, tmp_path):
    (tmp_path / "FILE").write_text("x")
    args = ["--run-dir", str(tmp_path / "r")] if flag != "--run-dir" else []
    _one_line(_train(flag, str(tmp_path / sub), *args), pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_a_run_dir_where_nothing_can_be_created(tmp_path):
    _one_line(
        _train("--run-dir", "/proc/x"), r"--run-dir /proc/x: cannot create directories in /proc"
    )
