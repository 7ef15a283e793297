"""A new kind of checkpoint store is one class and one `register(scheme, ...)` line.

The toy store below keeps its checkpoints in memory (a dict standing in for a server) and is
written here, as ddpkit.train.ckpt.objstore is in the kit; registered for `mem://` the way
the kit's own stores are chosen (by the checkpoint dir's URL scheme, ckpt.store.open_store),
the real Checkpointer saves through it (sync and async), prunes, resumes, skips a damaged
step for the one before, rewinds, and `ddpkit ckpt` reads a verified copy, with no other
file of the kit naming it. In-process, one gloo rank.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ddpkit.train.ckpt import store
from ddpkit.train.ckpt.files import METADATA, marker_files
from ddpkit.train.ckpt.layout import marker_of, verify
from ddpkit.train.ckpt.store import CheckpointStorage, StepRead, local_dir, step_number
from ddpkit.train.contract import CKPT_MARKER

SERVER: dict[str, dict[str, dict[str, bytes]]] = {}  # url -> {step name: {file: bytes}}


class MemStore:
    """Checkpoints in memory: a step is written into the staging dir, then taken in whole."""

    drop_hint = "delete them"

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.steps = SERVER.setdefault(self.url, {})
        self.dir = local_dir(self.url)  # this host's staging dir

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def holds(self, where: Any) -> bool:
        return str(where).startswith(f"{self.url}/")

    def check(self, wait_s: float = 0.0) -> str | None:
        return None

    def problem(self, e: BaseException, what: str = "", access: str = "read") -> str:
        return f"{what}{self.url}: cannot {access} it ({e})"

    def scan(self) -> tuple[list[str], dict[str, str]]:
        complete, partial = [], {}
        for name in sorted((n for n in self.steps if step_number(n) is not None), key=step_number):
            info, why = self.marker(name)
            if info is None:
                partial[name] = why or "incomplete"
            else:
                complete.append(name)
        return complete, partial

    def marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        files = self.steps.get(name, {})

        def read() -> bytes:
            if CKPT_MARKER not in files:
                raise FileNotFoundError(name)
            return files[CKPT_MARKER]

        info, why = marker_of(read)
        if info is not None and METADATA not in files:
            return None, f"no {METADATA}"
        return info, why

    def prepare(self, name: str) -> None:
        shutil.rmtree(self.dir / name, ignore_errors=True)
        (self.dir / name).mkdir(parents=True)
        self.steps.pop(name, None)

    def writer(self, path: Path) -> Any:
        from ddpkit.train.ckpt.io import HashingWriter

        return HashingWriter(path)

    def commit(self, path: Path, info: dict[str, Any], sums: dict[str, Any]) -> str:
        info["files"] = marker_files(path, sums)
        files = {p.name: p.read_bytes() for p in path.iterdir()}
        self.steps[path.name] = {**files, CKPT_MARKER: json.dumps(info).encode()}
        shutil.rmtree(path)
        return self.where(path.name)

    def read(self, name: str, dest: Path, here: bool, whole: bool = False) -> StepRead:
        if here:
            dest.mkdir(parents=True, exist_ok=True)
            for file, data in self.steps.get(name, {}).items():
                (dest / file).write_bytes(data)
        return StepRead(dest)

    def prune(self, keep: int) -> None:
        complete, partial = self.scan()
        newest = step_number(complete[-1]) if complete else -1
        for name in complete[:-keep]:
            del self.steps[name]
        for name in partial:
            if (step_number(name) or 0) < (newest or 0):
                del self.steps[name]

    def set_aside(self, name: str, aside: str) -> None:
        self.steps[aside] = self.steps.pop(name)

    def put(self, name: str, data: bytes) -> None:
        self.steps[name] = {"": data}


URL = "mem://toy/run"


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    pg = tmp_path_factory.mktemp("pg") / "pg"
    dist.init_process_group("gloo", init_method=f"file://{pg}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def mem(one_rank, tmp_path, monkeypatch):
    """The toy store registered for mem:// (the registry restored afterwards); staging in tmp."""
    monkeypatch.setattr(store, "_STORES", dict(store._STORES))
    store.register("mem", MemStore)
    monkeypatch.setenv(store.STAGE_ENV, str(tmp_path / "stage"))
    SERVER.clear()
    return SERVER


def _model(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def _saves(steps: list[int], use_async: bool, logs: list[str]) -> dict[int, torch.Tensor]:
    """Save the given steps through a Checkpointer of URL (keep 2); each step's weights."""
    from ddpkit.train.ckpt import Checkpointer, ModelState

    ck = Checkpointer(URL, 2, use_async, logs.append)
    assert isinstance(ck.store, MemStore) and isinstance(ck.store, CheckpointStorage)
    weights = {}
    for step in steps:
        model = _model(step)
        weights[step] = model.weight.detach().clone()
        ck.save(step, {"model": ModelState(model)}, {"step": step})
        ck.wait()
    ck.close()
    return weights


def test_a_registered_store_saves_prunes_and_resumes_through_the_checkpointer(mem):
    from ddpkit.train.ckpt import Checkpointer, ModelState

    logs: list[str] = []
    weights = _saves([1, 2, 3], False, logs)
    weights |= _saves([4], True, logs)  # an async save, its marker by the same commit
    assert sorted(mem[URL]) == ["step-3", "step-4"]  # keep-K through the store's prune
    assert [x.split(" (")[0] for x in logs] == [
        f"checkpoint saved: {URL}/step-{n}" for n in (1, 2, 3, 4)
    ]

    fresh = _model(99)
    ck = Checkpointer(URL, 2, False, logs.append)
    got = ck.resume("auto", {"model": ModelState(fresh)})
    assert got is not None and got[0] == f"{URL}/step-4" and got[1]["step"] == 4
    assert torch.equal(fresh.weight, weights[4])
    assert ck.holds(got[0]) and ck.newest() == f"{URL}/step-4"
    ck.close()


def test_a_damaged_step_is_skipped_and_a_rewind_sets_the_later_ones_aside(mem):
    from ddpkit.train.ckpt import Checkpointer, ModelState

    logs: list[str] = []
    weights = _saves([2, 4], False, logs)
    data = bytearray(mem[URL]["step-4"]["__0_0.distcp"])
    data[len(data) // 2] ^= 0x01
    mem[URL]["step-4"]["__0_0.distcp"] = bytes(data)

    fresh = _model(99)
    ck = Checkpointer(URL, 2, False, logs.append)
    got = ck.resume("auto", {"model": ModelState(fresh)})
    assert got is not None and got[0] == f"{URL}/step-2"
    assert torch.equal(fresh.weight, weights[2])
    [skip] = [x for x in logs if x.startswith("warning:")]
    assert skip.startswith(
        f"warning: skipping checkpoint {URL}/step-4: __0_0.distcp fails its checksum"
    )

    got = ck.resume(f"{URL}/step-2", {"model": ModelState(_model(98))})
    assert got is not None and got[0] == f"{URL}/step-2"
    assert (
        f"rewound to step-2: the later step-4 (another timeline) moved to {URL}/abandoned"
        in logs[-1]
    )
    assert ck.store.scan()[0] == ["step-2"]
    assert [n.split(".")[0] for n in mem[URL] if n.startswith("abandoned/")] == ["abandoned/step-4"]
    ck.close()


def test_ddpkit_ckpt_reads_a_verified_copy_from_the_registered_store(mem, tmp_path):
    _saves([3], False, [])
    copy, where = store.fetch(URL, tmp_path / "copy")
    assert where == f"{URL}/step-3"
    assert verify(copy) is None  # every file there, with the sizes and CRC-32s of its marker
