"""Corrupt or broken checkpoints fall back to the last good one, and the named stateful parts
a checkpoint holds load back into their owners. Single processes where the item allows; 2 ranks
for a shard of rank 1. Cases that resume the same way share one damaged run and its resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.trainrun import Run, clean_env, train

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


WRONG_SHAPES = ["[1, 2]", '"done"']  # a marker of valid JSON that is not an object


A_FILE = "a file"  # a step dir replaced by a file


@pytest.fixture(scope="module")
def fallen_back(tmp_path_factory) -> tuple[Run, dict[str, Path]]:
    """Every damage above, each wrong-shape marker and a step dir replaced by a file, on a
    checkpoint of its own in one single-process run (steps 3, 6, ..., 33), newest first down
    to an intact step-3; then one resume: it must pass over each in turn (one skip each), go
    on from step-3 and save over each."""
    rd = tmp_path_factory.mktemp("fallen") / "run"
    names = [A_FILE, *WRONG_SHAPES, *CASES]
    last = 3 * (1 + len(names))
    keep = ("--ckpt-keep", "100")  # prune nothing: neither the damaged nor the new saves
    train(rd, *ARGS, "--steps", str(last), *keep)
    steps = {n: rd / "checkpoints" / f"step-{last - 3 * i}" for i, n in enumerate(names)}
    shutil.rmtree(steps[A_FILE])
    steps[A_FILE].write_text("not a checkpoint")
    for marker in WRONG_SHAPES:
        (steps[marker] / ".complete").write_text(marker)
    for case, (damage, _) in CASES.items():
        damage(steps[case])
    # past the newest: every save of the resumed run replaces a damaged one, as step-7 did
    return train(rd, *ARGS, "--steps", str(last + 1), *keep), steps


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_newest_checkpoint_falls_back_to_the_previous(fallen_back, case):
    run, steps = fallen_back
    warns = [x for x in run.out.splitlines() if x.startswith("warning: skipping checkpoint")]
    assert len(warns) == len(CASES), run.out  # one for each broken checkpoint
    newest = steps[case]
    [warn] = [x for x in warns if x.startswith(f"warning: skipping checkpoint {newest}: ")]
    assert CASES[case][1] in warn, warn
    assert warn.endswith("trying the next older one")
    assert "Traceback" not in run.out
    assert run.summary["resumed_from"].endswith("step-3")


def test_resume_path_of_a_broken_checkpoint_is_one_line_and_writes_nothing(base, tmp_path, capsys):
    bad = tmp_path / "step-6"
    shutil.copytree(base / "checkpoints" / "step-6", bad)
    _xor(_shard(bad), 4096, 64)
    run = train(tmp_path / "new", "--resume", str(bad), "--steps", "7", check=False)
    assert run.rc == 2 and "Traceback" not in run.out
    [line] = run.out.splitlines()
    assert line.startswith(f"error: --resume {bad}: unusable checkpoint (__0_0.distcp fails")
    assert not (tmp_path / "new").exists()
    from ddpkit.tools import ckpt  # `ddpkit ckpt` in this process: no second torch import

    capsys.readouterr()
    ckpt.main(["inspect", str(bad), "--json"])
    info = json.loads(capsys.readouterr().out)
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


def test_a_step_dir_replaced_by_a_file_is_skipped_and_then_replaced(fallen_back):
    run, steps = fallen_back
    assert run.summary["resumed_from"].endswith("step-3")
    assert (steps[A_FILE] / ".complete").is_file()


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


@pytest.mark.parametrize("marker", WRONG_SHAPES)
def test_a_marker_of_the_wrong_shape_is_an_incomplete_checkpoint(fallen_back, marker):
    """Valid JSON that is not an object: the step dir is incomplete, resume falls back."""
    r, steps = fallen_back
    assert f"warning: skipping incomplete checkpoint {steps[marker]} (" in r.out, r.out
    assert r.summary["resumed_from"].endswith("step-3"), r.out


def test_export_refuses_a_checkpoint_that_fails_its_checksums(base, tmp_path, capsys):
    """Every reader verifies the same way: export of flipped bytes is one line and exit 2,
    with nothing written; inspect reports the same problem; the intact one exports. The tool's
    main in this process, as `ddpkit ckpt` runs it (a new process imports torch again)."""
    from ddpkit.tools import ckpt

    step = tmp_path / "step-6"
    shutil.copytree(base / "checkpoints/step-6", step)
    _xor(_shard(step), 4096, 64)
    out = tmp_path / "model.pt"
    capsys.readouterr()
    assert ckpt.main(["export", str(step), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "fails its checksums" in err and not out.exists()
    assert not list(tmp_path.glob("model.pt*"))
    ckpt.main(["inspect", str(step)])
    r = capsys.readouterr()
    assert "fails its checksum" in r.out, r.out + r.err
    rc = ckpt.main(["export", str(base / "checkpoints/step-3"), str(out)])
    assert rc == 0 and out.is_file(), capsys.readouterr().err


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


# --- two ranks, a user's project and the ddpkit command: one first run, one resume ----------
# A damaged marker the way the campaign found it (step-12, checked by `ckpt inspect` and by the
# resume), and two damaged shards of rank 1 (step-9: its checksum; step-6: no checksums, only
# the load on rank 1 fails); the resume passes over all three and goes on from step-3.

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
JOB = """\
name = "meta"
nproc_per_node = 2
accelerator = "cpu"
[train]
steps = 12
ckpt_interval = 3
ckpt_keep = 4
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


@dataclass
class TwoRanks:
    project: Path
    shown: subprocess.CompletedProcess[str]  # `ddpkit ckpt inspect` after the marker's damage
    again: subprocess.CompletedProcess[str]  # the resume after all three

    @property
    def out(self) -> str:
        return self.again.stdout + self.again.stderr

    def step(self, n: int) -> Path:
        return self.project / "runs" / "meta" / "checkpoints" / f"step-{n}"

    def paths(self, n: int) -> tuple[Path, Path]:
        """step-n as the resume may name it: absolute, or as the job gave it."""
        return self.step(n), self.step(n).relative_to(self.project)

    def skips(self, n: int) -> list[str]:
        """The resume's skip lines for step-n."""
        lines = [x for x in self.out.splitlines() if x.startswith("warning: skipping ")]
        return [x for x in lines if any(f" {p} " in x or f" {p}: " in x for p in self.paths(n))]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> TwoRanks:
    project = tmp_path_factory.mktemp("two") / "project"
    project.mkdir()
    (project / "ddpkit.toml").write_text(JOB)
    first = _ddpkit(project, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    ckpts = project / "runs" / "meta" / "checkpoints"
    marker = json.loads((ckpts / "step-12" / ".complete").read_text())
    marker["files"] = {name: 1 for name in marker["files"]}
    (ckpts / "step-12" / ".complete").write_text(json.dumps(marker))
    shown = _ddpkit(project, "ckpt", "inspect", "runs/meta")
    _xor(ckpts / "step-9" / "__1_0.distcp", 4096, 64)
    _legacy(ckpts / "step-6")  # no checksums: only the load on the ranks can fail
    shard = ckpts / "step-6" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    again = _ddpkit(project, "run", "--set", "train.steps=14")
    return TwoRanks(project, shown, again)


def _resumed_from_step_3(r: TwoRanks) -> None:
    assert r.again.returncode == 0 and "Traceback" not in r.out, r.out
    assert len([x for x in r.out.splitlines() if "skipping" in x]) == 3, r.out  # 12, 9, 6
    summary = json.loads((r.project / "runs" / "meta" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("runs/meta/checkpoints/step-3"), summary
    assert summary["steps"] == 14


def test_two_ranks_agree_on_a_load_that_fails_on_one_shard(two_ranks):
    [warn] = two_ranks.skips(6)
    heads = [f"warning: skipping checkpoint {p}: load failed (rank " for p in two_ranks.paths(6)]
    assert any(warn.startswith(h) for h in heads), warn
    _resumed_from_step_3(two_ranks)


def test_two_ranks_a_damaged_shard_of_rank_1_is_caught_by_its_checksum(two_ranks):
    """Rank 1 verifies the shard it wrote while loading it; rank 0 refuses the load too."""
    [warn] = two_ranks.skips(9)
    heads = [
        f"warning: skipping checkpoint {p}: __1_0.distcp fails its checksum"
        for p in two_ranks.paths(9)
    ]
    assert any(warn.startswith(h) for h in heads), warn
    _resumed_from_step_3(two_ranks)


def test_a_marker_whose_records_are_numbers_is_skipped_for_the_previous_checkpoint(two_ranks):
    """The campaign's case: the newest marker's file records are numbers, not objects. It was
    a 31-line AttributeError in training and in `ckpt inspect`; now both take the previous
    step (step-9 for inspect; the resume, which finds step-9 and step-6 damaged too, step-3)
    and say why step-12 is skipped in one line."""
    newest = two_ranks.step(12)
    why = "bad .complete marker: files['.metadata']: an integer (1), not an object"
    rel = newest.relative_to(two_ranks.project)  # the tools say paths as the user gave them

    shown = two_ranks.shown
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith(f"{rel.parent / 'step-9'}: step 9, written by 2 ranks")
    assert shown.stderr == f"warning: skipping incomplete checkpoint {rel} ({why})\n"

    [skip] = two_ranks.skips(12)
    assert skip in [f"warning: skipping incomplete checkpoint {p} ({why})" for p in (newest, rel)]
    _resumed_from_step_3(two_ranks)
