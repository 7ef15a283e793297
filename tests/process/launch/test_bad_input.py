"""Bad input is one line on stderr naming the problem and the fix, exit 2, no traceback, and
nothing lost or half-written: out-of-range seeds and durations at parse time; user datasets
whose samples do not stack (named with the item and the shapes, up front where a probe finds
it, else when the batch forms, on any rank, with or without DataLoader workers); a checkpoint
dir that is read-only from the start or turns read-only mid-run (a read-only bind mount: we
run as root, for whom chmod 555 changes nothing); `ckpt export` onto an existing output or a
leftover OUT.tmp; a SLURM job the partition can never run, refused at submit (fake sinfo
here; the real local cluster below).

Here the tests that start processes; the in-process ones in tests/unit/launch/test_bad_input.py,
those on a real SLURM cluster in tests/engines/slurm/test_bad_input.py. Helpers both use are in
tests/unit/launch/test_bad_input.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401 (a fixture)
from tests.trainrun import PY, clean_env, torchrun_cmd, train
from tests.unit.launch.test_bad_input import JOB, SINFO, _read_only, _run, _train_cmd, needs_mounts

WEEK = 7 * 24 * 3600
NUMBERS = [
    (
        ["--seed", str(2**63)],
        r"--seed must be in 0\.\.9223372036854775807 \(2\*\*63-1\), got 9223372036854775808$",
    ),
    (["--seed", "-1"], r"--seed must be in 0\.\.9223372036854775807 \(2\*\*63-1\), got -1$"),
    (["--timeout-s", "1e30"], rf"--timeout-s must be at most {WEEK} seconds \(one week\)"),
    (["--timeout-s", "inf"], r"--timeout-s must be a finite number, got inf"),
    (["--timeout-s", "nan"], r"--timeout-s must be a finite number, got nan"),
    (["--timeout-s", "-5"], r"--timeout-s must be > 0 seconds, got -5\.0"),
    (["--stop-check-s", "1e30"], rf"--stop-check-s must be at most {WEEK} seconds"),
    (["--stop-check-s", "-1"], r"--stop-check-s must be >= 0 seconds"),
    (["--shutdown-timeout-s", "1e30"], rf"--shutdown-timeout-s must be at most {WEEK} seconds"),
    (["--shutdown-timeout-s", "inf"], r"--shutdown-timeout-s must be a finite number, got inf"),
    (["--steps", str(2**63)], r"--steps must be at most 9223372036854775807 \(2\*\*63-1\)"),
    (["--batch-size", str(10**23)], r"--batch-size must be at most 9223372036854775807"),
]


@pytest.mark.parametrize("args,pattern", NUMBERS, ids=[" ".join(a) for a, _ in NUMBERS])
def test_seeds_and_durations_out_of_range_are_one_line_at_parse(
    args, pattern, tmp_path, one_line_error
):
    p = _run(_train_cmd(tmp_path / "r", "--steps", "2", *args))
    assert re.search(pattern, one_line_error(p)), p.stderr
    assert not (tmp_path / "r").exists()


def test_a_duration_out_of_range_is_refused_at_render(launcher, one_line_error):
    """The launcher runs the trainer's own checks: refused before anything is queued."""
    p = launcher("render", "local", "--set", "train.timeout_s=1e30")
    assert f"--timeout-s must be at most {WEEK} seconds" in one_line_error(p)


DDPKIT = Path(PY).with_name("ddpkit")
HUGE = "99999999999999999999999"


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--set", f"nodes={HUGE}"], "nodes"),
        (["--nodes", HUGE], "nodes"),
        (["--gpus", str(2**31)], "nproc_per_node"),
        (["--set", f"slurm.requeue_limit={HUGE}"], "slurm.requeue_limit"),
        (["--set", f"k8s.backoff_limit={HUGE}"], "k8s.backoff_limit"),
        (["--set", f"train.seed={2**63}"], "--seed"),
    ],
)
def test_a_number_out_of_range_is_one_line_at_the_edge(
    tmp_path, one_line_error, backend, args, where
):
    """From a project without a job file, through the installed command: every backend
    refuses a job number beyond what it can store, in one line, before rendering."""
    p = subprocess.run(
        [str(DDPKIT), "render", backend, "--config", "builtin:default", *args],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = one_line_error(p)
    assert line.startswith(f"error: {where} "), line
    assert "is over 2147483647" in line or "must be in 0..9223372036854775807" in line, line
    assert list(tmp_path.iterdir()) == []


def test_the_largest_seed_and_a_week_long_timeout_train(tmp_path):
    run = train(tmp_path / "r", "--steps", "2", "--seed", str(2**63 - 1), "--timeout-s", str(WEEK))
    assert run.rc == 0 and (run.run_dir / "summary.json").is_file()


# --- user datasets whose samples do not stack --------------------------------------------------

DATA_PKG = """
import torch
from torch.utils.data import Dataset, TensorDataset


def model(cfg):
    return torch.nn.Linear(16, 4)


class Items(Dataset):
    def __init__(self, make, n=256):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


def _ok(n):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def varying(cfg):  # every 7th sample is short: caught by the probe (train[0] is one)
    return Items(lambda i: (torch.zeros(12 if i % 7 == 0 else 16), i % 4)), None, {"num_classes": 4}


def strings(cfg):
    return Items(lambda i: ("text", i % 4)), None, {"num_classes": 4}


def val_differs(cfg):
    val = TensorDataset(torch.randn(64, 12), torch.randint(0, 4, (64,)))
    return _ok(256), val, {"num_classes": 4}


def bad_info(cfg):
    return _ok(256), None, {"num_classes": "four"}


def sneaky(cfg):  # one short sample that no probe reads: caught when its batch forms
    return Items(lambda i: (torch.zeros(12 if i == 100 else 16), i % 4)), None, {"num_classes": 4}
"""

UP_FRONT = [
    (
        "varying",
        r"^error: --dataset d18:varying: train\[1\] has x \[16\], y \[\], train\[0\] has x "
        r"\[12\], y \[\]; every sample must have the same shapes to stack into a batch",
    ),
    (
        "strings",
        r"^error: --dataset d18:strings: train\[0\]: its x is a str that is not a tensor of "
        r"numbers .*; return tensors, arrays or numbers$",
    ),
    (
        "val_differs",
        r"^error: --dataset d18:val_differs: val\[0\] has x \[12\], y \[\], train\[0\] has x "
        r"\[16\], y \[\]; every sample must have the same shapes",
    ),
    (
        "bad_info",
        r"^error: --dataset d18:bad_info returned info\['num_classes'\] = 'four'; it must be "
        r"an integer >= 0",
    ),
]
SNEAKY = (
    r"^error: --dataset d18:sneaky: item 100 has x \[12\], y \[\], item \d+ of the same batch "
    r"has x \[16\], y \[\]; every sample must have the same shapes to stack into a batch "
    r"\(pad or crop them in the dataset\)$"
)


@pytest.fixture
def data_pkg(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "d18.py").write_text(DATA_PKG)
    return {"PYTHONPATH": str(tmp_path)}


def _user_data(run_dir: Path, name: str, *args: str) -> list[str]:
    return _train_cmd(
        run_dir, "--model", "d18:model", "--dataset", f"d18:{name}", "--batch-size", "8", *args
    )


@pytest.mark.parametrize("name,pattern", UP_FRONT, ids=[c[0] for c in UP_FRONT])
def test_a_dataset_of_the_wrong_shape_is_one_line_before_training(
    name, pattern, tmp_path, data_pkg, one_line_error
):
    p = _run(_user_data(tmp_path / "r", name, "--steps", "2"), **data_pkg)
    assert re.search(pattern, "error: " + one_line_error(p).removeprefix("error: ")), p.stderr
    assert not (tmp_path / "r").exists()  # refused before the run dir is written


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_sample_of_another_shape_mid_epoch_names_its_index(
    workers, tmp_path, data_pkg, one_line_error
):
    p = _run(_user_data(tmp_path / "r", "sneaky", "--epochs", "1", "--num-workers", workers),
             **data_pkg)  # fmt: skip
    assert re.search(SNEAKY, one_line_error(p)), p.stderr
    assert not list((tmp_path / "r").glob("checkpoints/step-*"))


def _worker_lines(out: str) -> list[str]:
    """error: lines and worker tracebacks (torchrun's own report of the failure left out)."""
    errors = [x for x in out.splitlines() if x.startswith("error: ")]
    tracebacks = out.count("Traceback (most recent call last)") - out.count('torchrun", line')
    return errors + ["<worker traceback>"] * tracebacks


@pytest.mark.slow
@pytest.mark.parametrize("name", ["varying", "sneaky"])
def test_two_ranks_print_a_bad_dataset_once(name, tmp_path, data_pkg):
    cmd = torchrun_cmd(2)[:-2] + _user_data(tmp_path / "r", name, "--epochs", "1")[1:]
    p = _run(cmd, timeout=240, **data_pkg)
    assert p.returncode != 0 and "exitcode  : 2" in p.stderr, p.stderr[-3000:]
    lines = _worker_lines(p.stdout + p.stderr)
    pattern = SNEAKY if name == "sneaky" else UP_FRONT[0][1]
    assert len(lines) == 1 and re.search(pattern, lines[0]), lines


# A failed save is CheckpointDirUnwritable, one line; the lock's release on the way out
# (RunLock.release) leaves the lock in the now read-only dir instead of raising over it.
@needs_mounts
def test_a_checkpoint_dir_that_turns_read_only_is_one_line(tmp_path, one_line_error):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    flag = ckpt / "step-4" / ".complete"
    cmd = _train_cmd(tmp_path / "r", "--ckpt-dir", str(ckpt), "--steps", "400",
                     "--ckpt-interval", "4", "--log-interval", "100")  # fmt: skip
    p = _read_only(tmp_path, ckpt, str(flag), cmd)
    # The save that meets the read-only dir may have made its step dir already (the mount
    # lands while it writes): then the line names the file it was refused.
    line = one_line_error(p)
    m = re.fullmatch(
        rf"error: cannot write the checkpoint {re.escape(str(ckpt))}/(step-\d+) \(Read-only "
        rf"file system(: \S+)?\); the checkpoint dir is not writable now: make "
        rf"{re.escape(str(ckpt))} writable again \(or pass another --ckpt-dir\) and resume "
        r"from its last complete checkpoint",
        line,
    )
    assert m, line
    complete = [x.name for x in ckpt.glob("step-*") if (x / ".complete").is_file()]
    assert "step-4" in complete and m[1] not in complete  # the refused save never counts
    assert not (tmp_path / "r" / "summary.json").exists()


# --- ckpt export onto what exists ----------------------------------------------------------


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = train(tmp_path_factory.mktemp("export") / "r", "--steps", "2")
    return run.run_dir / "checkpoints" / "step-2"


def _export(step: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([PY, "-m", "ddpkit", "ckpt", "export", str(step), str(out), *args], 120)


def test_export_refuses_an_existing_file_and_force_replaces_it(step, tmp_path, one_line_error):
    out = tmp_path / "model.pt"
    out.write_bytes(b"the user's earlier export")
    line = one_line_error(_export(step, out))
    assert line == (
        f"error: export: {out} already exists; pass another output path, or --force to replace it"
    )
    assert out.read_bytes() == b"the user's earlier export"
    p = _export(step, out, "--force")
    assert p.returncode == 0, p.stderr
    import torch

    assert set(torch.load(out, weights_only=True)) == {"model", "meta"}
    assert not (tmp_path / "model.pt.tmp").exists()


def test_export_refuses_a_leftover_tmp_and_force_overwrites_it(step, tmp_path, one_line_error):
    out, tmp = tmp_path / "model.pt", tmp_path / "model.pt.tmp"
    tmp.write_bytes(b"left by an interrupted export")
    line = one_line_error(_export(step, out))
    assert line == (
        f"error: export: {tmp} exists (left by an interrupted export?); remove it, or pass "
        "--force to overwrite it"
    )
    assert tmp.read_bytes() == b"left by an interrupted export" and not out.exists()
    assert _export(step, out, "--force").returncode == 0
    assert out.is_file() and not tmp.exists()


@pytest.mark.parametrize("fmt", ["pt", "hf"])
def test_export_never_turns_a_directory_into_a_file_or_back(fmt, step, tmp_path, one_line_error):
    out = tmp_path / "out"
    if fmt == "pt":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    else:
        out.write_text("mine")
    args = ["--format", fmt, "--force"]
    line = one_line_error(_export(step, out, *args))
    kind, want = ("directory", "a file") if fmt == "pt" else ("file", "a directory")
    assert line == (
        f"error: export: {out} is an existing {kind}, and --format {fmt} writes {want}; pass "
        "another output path"
    )
    assert (out / "keep.txt" if fmt == "pt" else out).read_text() == "mine"


def test_export_refuses_an_existing_hf_directory(step, tmp_path, one_line_error):
    out = tmp_path / "hf-out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    line = one_line_error(_export(step, out, "--format", "hf"))
    assert "already exists; pass another output path, or --force to replace it" in line
    assert (out / "config.json").read_text() == "{}"


def test_export_under_a_file_is_one_line(step, tmp_path, one_line_error):
    (tmp_path / "f").write_text("x")
    line = one_line_error(_export(step, tmp_path / "f" / "model.pt"))
    assert line == f"error: export: {tmp_path}/f/model.pt is under {tmp_path}/f, a file; pass " \
        "another output path"  # fmt: skip


FAKE_SINFO = f"""#!/bin/sh
case "$*" in
  *"-p nosuch"*) exit 0 ;;
  *"-p short"*) printf '%s\\n' '{SINFO.splitlines()[2]}' ;;
  *"-p gpu"*) printf '%s\\n' '{SINFO.splitlines()[0]}' '{SINFO.splitlines()[1]}' ;;
  *) printf '%s' '{SINFO}' ;;
esac
"""
# Anything that would queue a job says so in a file: the tests assert that it was not called.
FAKE_SBATCH = (
    '#!/bin/sh\necho "$@" >> "$(dirname "$0")/sbatch.calls"\necho "Submitted batch job 9"\n'
)

SHORT, CPU = ["--set", "slurm.partition=short"], ["--set", "accelerator=cpu"]
PARTITION = [
    (
        ["--nodes", "4", "--gpus", "4"],
        r"^error: partition gpu has 3 node\(s\), the job asks 4 \(--nodes 4\): it would wait in "
        r"the queue forever; pass --nodes 3 or fewer \(NODES=\), or pick another partition",
    ),
    (
        ["--nodes", "2", "--gpus", "8"],
        r"^error: partition gpu: its nodes have at most 8 GPU\(s\) each \(sinfo gres\), the job "
        r"asks 2 node\(s\) x 8 \(--gpus 8\): it would wait in the queue forever; pass --gpus 4 "
        r"or fewer \(GPUS=\)",
    ),
    (
        ["--nodes", "1", "--gpus", "16"],
        r"^error: partition gpu: its nodes have at most 8 GPU\(s\) each .* pass --gpus 8 or fewer",
    ),
    (
        ["--nodes", "1", "--gpus", "1", "--set", "time=2-00:00:00"],
        r"^error: partition gpu allows jobs of at most 1440 min, the job asks 2880 min \(time = "
        r"'2-00:00:00'\): it would wait in the queue forever; lower time",
    ),
    (
        ["--nodes", "3", "--gpus", "1", *SHORT, *CPU, "--set", "time=00:10:00"],
        r"^error: partition short takes jobs of at most 2 node\(s\), the job asks 3",
    ),
    (
        ["--nodes", "1", "--gpus", "1", "--set", "slurm.partition=short", "--set", "time=10"],
        r"^error: partition short: its nodes have at most 0 GPU\(s\) each .* pass --gpus 0 or "
        r'fewer \(GPUS=\), or accelerator = "cpu"',
    ),
    (
        ["--nodes", "1", "--gpus", "1", *SHORT, *CPU],
        r"^error: partition short allows jobs of at most 30 min, the job asks 120 min",
    ),
    (
        ["--set", "slurm.partition=nosuch"],
        r"^error: slurm\.partition 'nosuch' is not a partition of this cluster",
    ),
]


@pytest.mark.parametrize("args,pattern", PARTITION, ids=[str(i) for i in range(len(PARTITION))])
def test_submit_refuses_what_the_partition_can_never_run(
    args, pattern, tmp_path, fake_bin, launcher, one_line_error
):
    fake_bin.add("sinfo", FAKE_SINFO)
    fake_bin.add("sbatch", FAKE_SBATCH)
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    p = launcher("submit", "slurm", "--config", str(job), *args, cwd=tmp_path, timeout=120)
    assert re.search(pattern, one_line_error(p)), p.stderr
    assert not (fake_bin.path / "sbatch.calls").exists()
    assert not (tmp_path / "runs").exists()  # no log dir made, nothing queued
