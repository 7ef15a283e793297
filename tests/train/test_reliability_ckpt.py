"""Corrupt or broken checkpoints fall back to the last good one, and the named stateful parts
a checkpoint holds load back into their owners. Single processes where the item allows; one 2-rank case."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainrun import clean_env, run_module, train

pytestmark = pytest.mark.slow

ARGS = ("--ckpt-interval", "3", "--no-eval", "--log-interval", "3", "--batch-size", "16")
ARGS += ("--synthetic-samples", "1024")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished single-process run with complete checkpoints at steps 3 and 6."""
    rd = tmp_path_factory.mktemp("base") / "run"
    train(rd, *ARGS, "--steps", "6")
    return rd


def _xor(path: Path, offset: int, n: int, value: int | None = None) -> None:
    b = bytearray(path.read_bytes())
    b[offset : offset + n] = bytes(
        value if value is not None else x ^ 0xFF for x in b[offset : offset + n]
    )
    path.write_bytes(bytes(b))


def _legacy(step: Path) -> None:
    """A marker written before checksums existed: only the load can find the damage."""
    m = json.loads((step / ".complete").read_text())
    del m["files"]
    (step / ".complete").write_text(json.dumps(m))


def _shard(step: Path) -> Path:
    return step / "__0_0.distcp"


CASES = {
    "flip 64 bytes": (lambda s: _xor(_shard(s), 4096, 64), "__0_0.distcp fails its checksum"),
    "4096 0xFF bytes": (lambda s: _xor(_shard(s), 8192, 4096, 0xFF), "fails its checksum"),
    "truncated shard": (
        lambda s: _shard(s).write_bytes(_shard(s).read_bytes()[:1000]),
        "__0_0.distcp has 1000 bytes",
    ),
    "missing shard": (lambda s: _shard(s).unlink(), "__0_0.distcp is missing"),
    "garbage .metadata": (
        lambda s: (s / ".metadata").write_bytes(b"\x00garbage" * 8),
        ".metadata has 64 bytes",
    ),
    "legacy marker, garbage .metadata": (
        lambda s: (_legacy(s), (s / ".metadata").write_bytes(b"garbage")),
        "unreadable .metadata",
    ),
    "legacy marker, truncated shard": (
        lambda s: (_legacy(s), _shard(s).write_bytes(_shard(s).read_bytes()[:1000])),
        "load failed (rank 0: ",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_newest_checkpoint_falls_back_to_the_previous(base, tmp_path, case):
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    newest = rd / "checkpoints" / "step-6"
    damage, phrase = CASES[case]
    damage(newest)
    run = train(rd, *ARGS, "--steps", "7")
    [warn] = [x for x in run.out.splitlines() if x.startswith("warning: skipping checkpoint")]
    assert warn.startswith(f"warning: skipping checkpoint {newest}: ") and phrase in warn, warn
    assert warn.endswith("trying the next older one")
    assert "Traceback" not in run.out
    assert run.summary["resumed_from"].endswith("step-3")


def test_resume_path_of_a_broken_checkpoint_is_one_line_and_writes_nothing(base, tmp_path):
    bad = tmp_path / "step-6"
    shutil.copytree(base / "checkpoints" / "step-6", bad)
    _xor(_shard(bad), 4096, 64)
    run = train(tmp_path / "new", "--resume", str(bad), "--steps", "7", check=False)
    assert run.rc == 2 and "Traceback" not in run.out
    [line] = run.out.splitlines()
    assert line.startswith(f"error: --resume {bad}: unusable checkpoint (__0_0.distcp fails")
    assert not (tmp_path / "new").exists()
    info = json.loads(run_module("ddpkit.tools.ckpt", "inspect", str(bad), "--json").stdout)
    assert info["checksums"].startswith("__0_0.distcp fails its checksum (crc32 ")


def test_when_no_checkpoint_loads_the_run_stops_with_one_line(base, tmp_path):
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    for step in ("step-3", "step-6"):
        _shard(rd / "checkpoints" / step).unlink()
    run = train(rd, *ARGS, "--steps", "7", check=False)
    assert run.rc == 2 and "Traceback" not in run.out
    errors = [x for x in run.out.splitlines() if x.startswith("error: ")]
    assert errors == [
        f"error: no usable checkpoint in {rd / 'checkpoints'}: all 2 complete ones fail "
        "verification or loading (warnings above); move them aside, or start over with "
        "--resume never or another --ckpt-dir"
    ]


@pytest.fixture(scope="module")
def base2(tmp_path_factory) -> Path:
    """A finished 2-rank run with complete checkpoints at steps 3 and 6."""
    rd = tmp_path_factory.mktemp("base2") / "run"
    train(rd, *ARGS, "--steps", "6", nproc=2)
    return rd


def test_two_ranks_agree_on_a_load_that_fails_on_one_shard(base2, tmp_path):
    rd = tmp_path / "run"
    shutil.copytree(base2, rd)
    newest = rd / "checkpoints" / "step-6"
    _legacy(newest)  # no checksums: only the load on the ranks can fail
    shard = newest / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    run = train(rd, *ARGS, "--steps", "7", nproc=2)
    assert f"warning: skipping checkpoint {newest}: load failed (rank " in run.out
    assert run.summary["resumed_from"].endswith("step-3")
    assert "Traceback" not in run.out


def test_two_ranks_a_damaged_shard_of_rank_1_is_caught_by_its_checksum(base2, tmp_path):
    """Rank 1 verifies the shard it wrote while loading it; rank 0 refuses the load too."""
    rd = tmp_path / "run"
    shutil.copytree(base2, rd)
    newest = rd / "checkpoints" / "step-6"
    _xor(newest / "__1_0.distcp", 4096, 64)
    run = train(rd, *ARGS, "--steps", "7", nproc=2)
    [warn] = [x for x in run.out.splitlines() if x.startswith("warning: skipping checkpoint")]
    assert warn.startswith(
        f"warning: skipping checkpoint {newest}: __1_0.distcp fails its checksum"
    )
    assert run.summary["resumed_from"].endswith("step-3")
    assert "Traceback" not in run.out


def test_a_part_missing_from_an_older_checkpoint_keeps_its_fresh_value(tmp_path):
    """In-process (world size 1, gloo): save without a part, load with it: one warning."""
    import torch.distributed as dist
    from ddpkit.train.ckpt import Checkpointer, ModelState, Values

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        logs: list[str] = []
        ck = Checkpointer(str(tmp_path / "ck"), 3, False, logs.append)
        model = torch.nn.Linear(3, 2)
        counter = {"n": 5}
        ck.save(1, {"model": ModelState(model)}, {"step": 1})
        extra = {"n": 7}  # the fresh value of a part the checkpoint predates
        states = {
            "model": ModelState(model),
            "counter": Values(lambda: counter, counter.update),
            "extra": Values(lambda: extra, extra.update),
        }
        got = ck.resume("auto", states)
        assert got is not None and got[0].name == "step-1"
        warnings = [x for x in logs if x.startswith("warning:")]
        assert warnings == [
            f"warning: checkpoint {got[0]} has no counter, extra (written before they were "
            "checkpointed): fresh values kept"
        ]
        assert extra == {"n": 7} and counter == {"n": 5}
        ck.close()
    finally:
        dist.destroy_process_group()


def test_changing_the_optimizer_on_resume_is_one_line_or_reset(base, tmp_path):
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    run = train(rd, *ARGS, "--steps", "7", "--optimizer", "sgd", check=False)
    assert run.rc == 2 and "Traceback" not in run.out
    [line] = [x for x in run.out.splitlines() if x.startswith("error: ")]
    assert line == (
        f"error: checkpoint {rd / 'checkpoints' / 'step-6'} holds the state of adamw (exp_avg, "
        "exp_avg_sq, step), this run's optimizer keeps momentum_buffer; resume with the "
        "optimizer it was saved with, or pass --reset-optimizer to start the optimizer state fresh"
    )
    run = train(rd, *ARGS, "--steps", "7", "--optimizer", "sgd", "--reset-optimizer")
    assert "--reset-optimizer: the optimizer state starts fresh" in run.out
    assert run.summary["resumed_from"].endswith("step-6")


def test_a_step_dir_replaced_by_a_file_is_skipped_and_then_replaced(base, tmp_path):
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    step6 = rd / "checkpoints" / "step-6"
    shutil.rmtree(step6)
    step6.write_text("not a checkpoint")
    run = train(rd, *ARGS, "--steps", "6")
    assert run.summary["resumed_from"].endswith("step-3")
    assert (step6 / ".complete").is_file()


def _to_pre_parts_layout(step: Path) -> None:
    """Rewrite a step dir as versions before the named parts wrote it: the sampler's position
    inside the train state, no first_loss, no checksums in the marker."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    flat = step.parent / "flat.pt"
    dcp_to_torch_save(step, flat)
    sd = torch.load(flat, weights_only=False)
    sd["train"].update(sd.pop("sampler"))
    del sd["train"]["first_loss"]
    torch.save(sd, flat)
    marker = json.loads((step / ".complete").read_text())
    del marker["files"]
    shutil.rmtree(step)
    torch_save_to_dcp(flat, step)
    flat.unlink()
    (step / ".complete").write_text(json.dumps(marker))


def test_a_checkpoint_from_before_the_named_parts_resumes_where_it_stopped(base, tmp_path):
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    shutil.rmtree(rd / "checkpoints" / "step-6")
    _to_pre_parts_layout(rd / "checkpoints" / "step-3")
    run = train(rd, *ARGS, "--steps", "6")
    assert run.summary["resumed_from"].endswith("step-3")
    assert "(epoch 0, 48 samples into it)" in run.out  # 3 steps x batch 16: from the train state
    assert "has no train.first_loss" in run.out and "sampler" not in run.out.split("warning")[1]
    uninterrupted = json.loads((base / "summary.json").read_text())
    assert run.summary["param_digest"] == uninterrupted["param_digest"]


@pytest.mark.parametrize("marker", ["[1, 2]", '"done"'])
def test_a_marker_of_the_wrong_shape_is_an_incomplete_checkpoint(base, tmp_path, marker):
    """Valid JSON that is not an object: the step dir is incomplete, resume falls back."""
    rd = tmp_path / "run"
    shutil.copytree(base, rd)
    (rd / "checkpoints/step-6/.complete").write_text(marker)
    r = train(rd, *ARGS, "--steps", "8")
    assert r.summary["resumed_from"].endswith("step-3"), r.out


def test_export_refuses_a_checkpoint_that_fails_its_checksums(base, tmp_path):
    """Every reader verifies the same way: export of flipped bytes is one line and exit 2,
    with nothing written; inspect reports the same problem; the intact one exports."""
    import subprocess
    import sys

    step = tmp_path / "step-6"
    shutil.copytree(base / "checkpoints/step-6", step)
    _xor(_shard(step), 4096, 64)
    out = tmp_path / "model.pt"
    cmd = [sys.executable, "-m", "ddpkit", "ckpt"]
    r = subprocess.run([*cmd, "export", str(step), str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "fails its checksums" in r.stderr and not out.exists()
    assert not list(tmp_path.glob("model.pt*"))
    r = subprocess.run([*cmd, "inspect", str(step)], capture_output=True, text=True)
    assert "fails its checksum" in r.stdout, r.stdout + r.stderr
    ok = subprocess.run([*cmd, "export", str(base / "checkpoints/step-3"), str(out)],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0 and out.is_file(), ok.stderr


def test_a_rewind_keeps_its_own_saves_and_sets_the_later_timeline_aside(tmp_path):
    """--resume step-4 after a run to step 8, with --ckpt-keep 1: the new timeline's saves
    stay (pruning by step number used to delete them for the abandoned step-8), the later
    checkpoints move to checkpoints/abandoned/ with one line, and --resume auto goes on from
    the new timeline."""
    rd = tmp_path / "run"
    args = ("--ckpt-interval", "2", "--no-eval", "--log-interval", "2", "--batch-size", "16",
            "--synthetic-samples", "1024")  # fmt: skip
    train(rd, *args, "--steps", "8")
    ck = rd / "checkpoints"
    rewind = train(rd, *args, "--steps", "6", "--ckpt-keep", "1", "--resume", str(ck / "step-4"))
    assert "rewound to step-4" in rewind.out, rewind.out
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-6"]
    aside = sorted(p.name.split(".")[0] for p in (ck / "abandoned").iterdir())
    assert aside == ["step-6", "step-8"]
    again = train(rd, *args, "--steps", "8")
    assert again.summary["resumed_from"].endswith("checkpoints/step-6"), again.out


# --- a damaged marker, the way the campaign found it: a user's project, the ddpkit command -----

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
JOB = """\
name = "meta"
nproc_per_node = 2
accelerator = "cpu"
[train]
steps = 6
ckpt_interval = 3
log_interval = 3
eval = false
batch_size = 16
synthetic_samples = 1024
"""


def _ddpkit(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DDPKIT), *args], cwd=project, env=clean_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_a_marker_whose_records_are_numbers_is_skipped_for_the_previous_checkpoint(tmp_path):
    """The campaign's case: the newest marker's file records are numbers, not objects. It was
    a 31-line AttributeError in training and in `ckpt inspect`; now both take step-3 and say
    why step-6 is skipped in one line."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "ddpkit.toml").write_text(JOB)
    first = _ddpkit(project, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    ckpts = project / "runs" / "meta" / "checkpoints"
    newest = ckpts / "step-6"
    marker = json.loads((newest / ".complete").read_text())
    marker["files"] = {name: 1 for name in marker["files"]}
    (newest / ".complete").write_text(json.dumps(marker))
    why = "bad .complete marker: files['.metadata']: an integer (1), not an object"

    rel = newest.relative_to(project)  # the tools say paths as the user gave them

    shown = _ddpkit(project, "ckpt", "inspect", "runs/meta")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith(f"{rel.parent / 'step-3'}: step 3, written by 2 ranks")
    assert shown.stderr == f"warning: skipping incomplete checkpoint {rel} ({why})\n"

    again = _ddpkit(project, "run", "--set", "train.steps=8")
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "Traceback" not in out, out
    [skip] = [line for line in out.splitlines() if "skipping" in line]
    assert skip in [f"warning: skipping incomplete checkpoint {p} ({why})" for p in (newest, rel)]
    summary = json.loads((project / "runs" / "meta" / "summary.json").read_text())
    assert summary["resumed_from"].endswith(f"{rel.parent / 'step-3'}"), summary
    assert summary["steps"] == 8
