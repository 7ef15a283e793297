"""What a user sees from --help and from a tool whose output is cut short (`| head -1`).

Here the tests that start processes; the in-process ones in tests/unit/launch/test_cli_help.py.
Helpers both use are in tests/unit/launch/test_cli_help.py."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest
from ddpkit.train.config import TrainConfig, field_help

from tests.unit.launch.test_cli_help import ROOT, _help_entries


def test_every_flag_has_its_meaning_and_default_once():
    entries = _help_entries()
    cfg_fields = [f for f in fields(TrainConfig) if f.metadata.get("cli") is not False]
    for f in cfg_fields:
        flag = "--" + f.name.replace("_", "-")
        assert flag in entries, f"{flag} missing from --help"
        text = entries[flag]
        assert field_help()[f.name], f"TrainConfig.{f.name} has no trailing comment"
        assert text.startswith(field_help()[f.name]), (flag, text)
        assert text.count("(default:") <= 1, (flag, text)
        assert "(default: None)" not in text and "(default: )" not in text, (flag, text)
    assert entries["--batch-size"] == "per rank, per micro-step (default: 64)"
    assert entries["--lr"].endswith("(default: 0.001)")
    assert "(default:" not in entries["--steps"]  # None: the comment says what happens


@pytest.fixture(scope="module")
def run_with_checkpoints(tmp_path_factory):
    """A run dir with a complete step-4 and a cut-short step-6 (no marker), 1500 tensors each."""
    import json
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    run = tmp_path_factory.mktemp("run")
    for step, complete in ((4, True), (6, False)):
        sd = {"model": {f"layers.{i}.weight": torch.full((4, 4), float(step)) for i in range(1500)}}
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore")
            dcp.save(sd, checkpoint_id=str(run / "checkpoints" / f"step-{step}"), no_dist=True)
        if complete:
            info = {"step": step, "world_size": 2, "parallel": "ddp", "model": "mlp"}
            (run / "checkpoints" / f"step-{step}" / ".complete").write_text(json.dumps(info))
    return run


@pytest.mark.parametrize("where", ["", "checkpoints"])
def test_ckpt_inspect_takes_a_run_or_checkpoints_dir(run_with_checkpoints, where):
    p = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.ckpt", "inspect", str(run_with_checkpoints / where)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    # the newest COMPLETE one: step-6 has no marker
    assert first.startswith(f"{run_with_checkpoints / 'checkpoints' / 'step-4'}: step 4,"), first
    lines = p.stdout.splitlines()
    assert lines[2] == "checksums: none recorded"  # a marker written without them
    assert len(lines) == 3 + 1500  # header, sizes, checksums, one line per tensor


def test_ckpt_inspect_with_only_cut_short_saves_names_them(tmp_path, run_with_checkpoints):
    import shutil

    shutil.copytree(run_with_checkpoints / "checkpoints" / "step-6", tmp_path / "step-6")
    p = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.ckpt", "inspect", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == (
        f"error: {tmp_path}: no complete checkpoint (step-6 lack .complete: a save was cut "
        "short); pass a step-N dir to read one anyway\n"
    )


def test_ckpt_inspect_piped_into_head_ends_quietly(run_with_checkpoints):
    # ~140 KB of output: more than a pipe holds, so the tool is still writing when head exits
    tool = subprocess.Popen(
        [sys.executable, "-m", "ddpkit.tools.ckpt", "inspect", str(run_with_checkpoints)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.run(["head", "-1"], stdin=tool.stdout, capture_output=True, timeout=120)
    tool.stdout.close()
    err = tool.stderr.read().decode()
    assert tool.wait(timeout=120) == 1
    assert head.stdout.decode().count("\n") == 1 and "step 4" in head.stdout.decode()
    assert "Traceback" not in err and "BrokenPipe" not in err and err == "", err


@pytest.mark.parametrize(
    "tool,args,needle",
    [
        ("ddpkit.tools.plot", ["/nonexistent-run"], "/nonexistent-run"),
        ("ddpkit.tools.ckpt", ["inspect", "/nonexistent-run"], "no such directory"),
        ("ddpkit.tools.ckpt", ["bogus"], "invalid choice"),
        ("ddpkit.tools.commbench", ["--iters", "0"], "--iters 0 must be >= 1"),
        ("ddpkit.tools.doctor", ["--timeout-s", "0"], "must be > 0 seconds"),
        ("ddpkit.tools.planner", ["--params", "7e9", "--gpus", "x"], "invalid int value"),
    ],
)
def test_a_user_error_is_one_line_and_exit_2(tool, args, needle):
    p = subprocess.run(
        [sys.executable, "-m", tool, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and needle in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""
