"""Checksums taken while writing and verified while reading (ddpkit.train.ckpt.io): the sums
equal a read-back's, each rank verifies only its share, and damage is caught wherever it is.

Here the tests that start processes; the in-process ones in
tests/unit/train/ckpt/test_ckpt_io.py. Helpers both use are in
tests/unit/train/ckpt/test_ckpt_io.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ddpkit.train.ckpt.files import checksum_files

from tests.unit.train.ckpt.test_ckpt_io import _xor


def _two_ranks(rank: int, root: str, damage: str | None) -> None:
    from ddpkit.train.ckpt import Checkpointer, UnusableCheckpoint, Values
    from ddpkit.train.ckpt.io import _VerifyingStream

    root_p = Path(root)
    dist.init_process_group("gloo", init_method=f"file://{root_p / 'pg'}", rank=rank, world_size=2)
    hashed: list[str] = []
    finish = _VerifyingStream.finish

    def counting_finish(self):
        hashed.append(self.name)
        finish(self)

    _VerifyingStream.finish = counting_finish  # type: ignore[method-assign]
    try:
        ck = Checkpointer(str(root_p / "ck"), 2, False, lambda m: None)
        mine = {"x": torch.full((4096,), float(rank))}  # each rank writes its own file
        ck.save(1, {f"r{rank}": Values(lambda: mine, mine.update)}, {"step": 1})
        dist.barrier()
        step = root_p / "ck" / "step-1"
        out = {"marker_ok": None, "problem": None}
        if rank == 0:
            files = json.loads((step / ".complete").read_text())["files"]
            out["marker_ok"] = files == checksum_files(step)
            if damage:
                _xor(step / damage, 300, 8)
        dist.barrier()
        got = {"x": torch.zeros(4096)}
        try:
            ck.load(step, {f"r{rank}": Values(lambda: got, got.update)})
        except UnusableCheckpoint as e:
            out["problem"] = str(e)
        out["hashed"] = hashed
        out["loaded"] = got["x"][0].item()
        (root_p / f"rank{rank}.json").write_text(json.dumps(out))
        ck.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("damage", [None, "__1_0.distcp"])
def test_two_ranks_verify_their_own_files_and_agree(tmp_path, damage):
    mp.spawn(_two_ranks, args=(str(tmp_path), damage), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["marker_ok"]
    assert (r0["hashed"], r1["hashed"]) == (["__0_0.distcp"], ["__1_0.distcp"])
    if damage is None:
        assert (r0["problem"], r1["problem"]) == (None, None)
        assert (r0["loaded"], r1["loaded"]) == (0.0, 1.0)
    else:  # rank 1 found it; rank 0, whose file was fine, refuses the load too
        assert r0["problem"] == r1["problem"]
        assert r0["problem"].startswith("__1_0.distcp fails its checksum (crc32 ")
