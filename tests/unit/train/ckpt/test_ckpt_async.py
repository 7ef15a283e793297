"""An async save copies the state in the background (ddpkit.train.ckpt.staging) while the
loop goes on, and the loop fences that copy before its optimizer step
(Checkpointer.wait_staging): the checkpoint holds the state as it was at save(), though the
loop's next forward/backward ran beside the copy and its optimizer step came right after the
fence. The copy is held back here by a gate, so that save() is seen returning before it.

Here the tests that run in this process; those that start processes in
tests/process/train/ckpt/test_ckpt_async.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def _held_copies() -> tuple[threading.Event, object]:
    """Make every staging copy wait for the returned gate; returns (gate, the original)."""
    from ddpkit.train.ckpt import staging

    gate = threading.Event()
    copy = staging._CopyWithoutGil._stage_untyped_storage

    def held(self, storage, non_blocking=False):
        assert gate.wait(timeout=60), "the test never opened the gate"
        return copy(self, storage, non_blocking)

    staging._CopyWithoutGil._stage_untyped_storage = held  # type: ignore[method-assign]
    return gate, copy


def _release_copies(copy: object) -> None:
    from ddpkit.train.ckpt import staging

    staging._CopyWithoutGil._stage_untyped_storage = copy  # type: ignore[method-assign]


def _build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _forward_backward(model: nn.Module) -> None:
    model(torch.randn(16, 32)).square().mean().backward()


def _flat(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters and AdamW's moments, copied."""
    moments = [opt.state[p][k] for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
    return [t.detach().clone() for t in [*model.parameters(), *moments]]


def _fenced_save(rank: int, world: int, root: str) -> None:
    """One rank: an async save with its copy held back, the next step's forward/backward,
    the fence, the optimizer step; then what a resume loads against the state at save()."""
    from ddpkit.train.ckpt import Checkpointer, ModelState, OptimizerState

    root_p = Path(root)
    dist.init_process_group(
        "gloo", init_method=f"file://{root_p / 'pg'}", rank=rank, world_size=world
    )
    gate, copy = _held_copies()
    try:
        model, opt = _build()
        _forward_backward(model)
        opt.step()  # AdamW's moments exist from here
        at_save = _flat(model, opt)
        ck = Checkpointer(str(root_p / "ck"), 2, True, lambda m: None)
        ck.save(1, {"model": ModelState(model), "optim": OptimizerState(model, opt)}, {"step": 1})
        out = {"returned_before_copy": not ck._staging.done()}
        opt.zero_grad(set_to_none=True)
        _forward_backward(model)  # the next step runs beside the copy
        threading.Timer(0.3, gate.set).start()
        ck.wait_staging()  # the trainer's fence before its optimizer step
        opt.step()  # changes every parameter and moment in place
        out["changed_after_fence"] = all(
            not torch.equal(a, b) for a, b in zip(at_save, _flat(model, opt), strict=True)
        )
        ck.wait()
        dist.barrier()  # rank 0 writes the marker after the others' wait() returns
        fresh, fresh_opt = _build()
        _forward_backward(fresh)
        fresh_opt.step()
        got = ck.resume(
            "auto", {"model": ModelState(fresh), "optim": OptimizerState(fresh, fresh_opt)}
        )
        out["resumed"] = got is not None and got[0].name == "step-1"
        out["equal_at_save"] = all(
            torch.equal(a, b) for a, b in zip(at_save, _flat(fresh, fresh_opt), strict=True)
        )
        ck.close()
        (root_p / f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        gate.set()
        _release_copies(copy)
        dist.destroy_process_group()


def _check(root: Path, world: int) -> None:
    for rank in range(world):
        out = json.loads((root / f"rank{rank}.json").read_text())
        assert out == {
            "returned_before_copy": True,
            "changed_after_fence": True,
            "resumed": True,
            "equal_at_save": True,  # without the fence: the weights after the optimizer step
        }, (rank, out)


def test_a_forward_before_the_fence_does_not_reach_the_saved_buffers(tmp_path):
    """BatchNorm's running statistics change in every training forward, before the fence:
    the checkpoint holds them as they were at save()."""
    from ddpkit.train.ckpt import Checkpointer, ModelState

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    gate, copy = _held_copies()
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
        model(torch.randn(16, 8))
        at_save = {k: v.clone() for k, v in model.state_dict().items()}
        ck = Checkpointer(str(tmp_path / "ck"), 2, True, lambda m: None)
        ck.save(1, {"model": ModelState(model)}, {"step": 1})
        model(torch.randn(16, 8) * 5 + 3)  # the next step's forward, the copy still held
        assert not torch.equal(model[1].running_mean, at_save["1.running_mean"])
        gate.set()
        ck.wait_staging()
        ck.wait()
        fresh = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
        assert ck.resume("auto", {"model": ModelState(fresh)}) is not None
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, at_save[k]), k
        ck.close()
    finally:
        gate.set()
        _release_copies(copy)
        dist.destroy_process_group()


def test_the_staging_copy_reuses_its_buffers_and_keeps_views_of_one_storage():
    from ddpkit.train.ckpt.staging import background_stager, release_stager

    base = torch.arange(12.0)
    state = {"a": base[:6].view(2, 3), "b": base[6:], "n": 3, "c": torch.ones(2)}
    stager = background_stager(cuda=False)
    try:
        one = stager.stage(state).result()
        assert torch.equal(one["a"], base[:6].view(2, 3)) and torch.equal(one["b"], base[6:])
        assert one["n"] == 3 and torch.equal(one["c"], torch.ones(2))
        buffer = one["a"].untyped_storage().data_ptr()
        assert one["b"].untyped_storage().data_ptr() == buffer != base.data_ptr()
        base.add_(100)
        state["c"].mul_(2)
        two = stager.stage(state).result()
        assert torch.equal(two["b"], base[6:]) and torch.equal(two["c"], torch.full((2,), 2.0))
        assert two["a"].untyped_storage().data_ptr() == buffer  # the same host buffer
    finally:
        release_stager(stager)


def test_the_staging_copy_survives_torch_closing_it_after_each_stage():
    """torch 2.11's DefaultStager closes its StateDictStager after every stage (2.14's does
    not). That emptied the copy's dispatch table: the second async save of a run failed with
    `KeyError: <class 'type'>` (seen with the kit's trainer on an H200), and the host buffers
    were dropped instead of reused. Done by hand here, as 2.11 does it."""
    from ddpkit.train.ckpt.staging import background_stager, release_stager

    state = {"w": torch.arange(6.0), "meta": {"step": 1, "kind": dict}}
    stager = background_stager(cuda=False)
    try:
        one = stager.stage(state).result()
        stager._state_dict_stager.close()  # what torch 2.11's DefaultStager._stage does
        state["w"].add_(1)
        two = stager.stage(state).result()
        assert torch.equal(two["w"], torch.arange(6.0) + 1) and two["meta"] == state["meta"]
        assert two["w"].untyped_storage().data_ptr() == one["w"].untyped_storage().data_ptr()
    finally:
        release_stager(stager)
