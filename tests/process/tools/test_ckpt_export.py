"""`ckpt export` (and `inspect`) of a step dir that its run prunes (--ckpt-keep) while the tool
reads it: after the tool chose it, or while DCP reads its files. One line, exit 2, nothing
written (no output, no OUT.tmp); a read that fails with every file in place keeps its
traceback. The prune is injected at the exact moment around the tool's main (the trainer's own
order: the marker first, then the directory): in this process for the one-line refusals (a new
process imports torch again, seconds of CPU here), by a driver process for the traceback.

Every test here reads a run a real `python -m ddpkit.train` wrote, or starts the tool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools import ckpt

from tests.badjson import marker_cases
from tests.trainrun import PY, ROOT, clean_env, train

DRIVER = """
import sys

from torch.distributed.checkpoint import FileSystemReader

from ddpkit.tools import ckpt


def broken(self, plan, planner):  # a read error with every file in place, not a prune
    raise RuntimeError("a disk error, not a prune")


FileSystemReader.read_data = broken
sys.exit(ckpt.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(tmp_path_factory.mktemp("pruned") / "r", "--steps", "2").run_dir


def _tool(tmp_path: Path, run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ddpkit ckpt ARGS` in a process whose DCP reads fail (DRIVER), on a copy of `run`."""
    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    (tmp_path / "driver.py").write_text(DRIVER)
    cmd = [PY, str(tmp_path / "driver.py"), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120
    )


def _prune(p: Path) -> None:
    (p / ".complete").unlink()
    shutil.rmtree(p)


def _tool_here(
    monkeypatch, capsys, tmp_path: Path, run: Path, when: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """ckpt.main in this process on a copy of `run`, the step dir pruned after it was
    chosen ("chosen") or as DCP opens its data files ("reading"); output captured."""
    shutil.copytree(run, tmp_path / "r")
    if when == "chosen":
        choose = ckpt._checkpoint_dir

        def chosen(path):
            p = choose(path)
            _prune(p)
            return p

        monkeypatch.setattr(ckpt, "_checkpoint_dir", chosen)
    else:
        from torch.distributed.checkpoint import FileSystemReader

        read_data = FileSystemReader.read_data

        def reading(self, plan, planner):
            _prune(Path(self.path))
            return read_data(self, plan, planner)

        monkeypatch.setattr(FileSystemReader, "read_data", reading)
    capsys.readouterr()
    rc = ckpt.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["ddpkit", "ckpt", *args], rc, out, err)


@pytest.mark.parametrize("when", ["chosen", "reading"])
def test_export_of_a_step_dir_pruned_while_it_is_read_is_one_line(
    when, run, tmp_path, one_line_error, monkeypatch, capsys
):
    out = tmp_path / "model.pt"
    args = ("export", str(tmp_path / "r"), str(out))
    line = one_line_error(_tool_here(monkeypatch, capsys, tmp_path, run, when, *args))
    step = tmp_path / "r" / "checkpoints" / "step-2"
    assert line == (
        f"error: {step}: deleted while export read it (pruned by its run's --ckpt-keep?); "
        "nothing was written; pass the run dir for its newest complete checkpoint, or a newer "
        "step-N dir"
    )
    assert not out.exists() and not (tmp_path / "model.pt.tmp").exists()


def test_inspect_of_a_step_dir_pruned_after_it_was_chosen_is_one_line(
    run, tmp_path, one_line_error, monkeypatch, capsys
):
    args = ("inspect", str(tmp_path / "r"))
    line = one_line_error(_tool_here(monkeypatch, capsys, tmp_path, run, "chosen", *args))
    assert "step-2: deleted while inspect read it (pruned by its run's --ckpt-keep?); " in line


def test_a_read_error_with_every_file_in_place_keeps_its_traceback(run, tmp_path):
    out = tmp_path / "model.pt"
    p = _tool(tmp_path, run, "export", str(tmp_path / "r"), str(out))
    assert p.returncode == 1, p.stderr
    assert "Traceback" in p.stderr and "a disk error, not a prune" in p.stderr
    assert not out.exists() and not (tmp_path / "model.pt.tmp").exists()


MARKERS = marker_cases()


@pytest.fixture(scope="module")
def damaged_run(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of `run` with a step-9 beside its step-2: the same files, a marker to damage."""
    copy = tmp_path_factory.mktemp("damaged") / "r"
    shutil.copytree(run, copy)
    shutil.copytree(copy / "checkpoints" / "step-2", copy / "checkpoints" / "step-9")
    return copy


@pytest.mark.parametrize("label", list(MARKERS))
def test_a_damaged_marker_is_skipped_by_inspect_and_refused_by_export(
    damaged_run, label, tmp_path, capsys
):
    """What a resume does: inspect of the run takes the previous step dir with one warning;
    inspect of the step dir itself shows why it is incomplete; export refuses it in one line."""
    newest = damaged_run / "checkpoints" / "step-9"
    (newest / ".complete").write_bytes(MARKERS[label])
    assert ckpt.main(["inspect", str(damaged_run), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["path"] == str(damaged_run / "checkpoints" / "step-2")
    [warning] = err.splitlines()
    assert warning.startswith(
        f"warning: skipping incomplete checkpoint {newest} (bad .complete marker: "
    ), warning

    assert ckpt.main(["inspect", str(newest), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["complete"] is False and shown["marker"].startswith("bad .complete marker: ")
    assert shown["checksums"] == f"not checked ({shown['marker']})"

    out_file = tmp_path / "model.pt"
    assert ckpt.main(["export", str(newest), str(out_file)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {newest}: bad .complete marker: ") and err.count("\n") == 1
    assert not out and not out_file.exists()


def test_inspect_of_a_file_says_it_is_a_file(tmp_path, one_line_error):
    """`ddpkit ckpt inspect model.pt`: an existing file is not "no such directory"."""
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not a checkpoint directory")

    def inspect(path: Path) -> str:
        p = subprocess.run([ddpkit, "ckpt", "inspect", str(path)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        return one_line_error(p)

    line = inspect(pt)
    assert "a file, not a checkpoint directory" in line and "no such directory" not in line
    assert "no such directory" in inspect(tmp_path / "missing")
