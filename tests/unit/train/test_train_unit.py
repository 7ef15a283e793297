"""Fast unit tests of the training module's pure parts: sampler, LR rules, config."""

from __future__ import annotations

import math

import pytest
import torch
from ddpkit.train.config import ConfigError, parse_config
from ddpkit.train.data import GlobalBatchSampler
from ddpkit.train.loop.schedule import lr_multiplier, scaled_lr


def epoch_of(n, batch, world, seed=0, epoch=0):
    shards = []
    for r in range(world):
        s = GlobalBatchSampler(n, batch, world, r, seed)
        s.epoch = epoch
        shards.append([i for b in s.epoch_indices() for i in b])
    return shards


def test_shards_are_disjoint_and_cover_the_epoch():
    n, batch, world = 103, 4, 3  # 103 // 12 = 8 global batches, 7 samples dropped
    shards = epoch_of(n, batch, world)
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen)) == 8 * 12  # disjoint
    assert all(len(s) == 32 for s in shards)  # equal per rank: no rank waits for another
    assert set(seen) <= set(range(n)) and n - len(seen) < batch * world  # only the tail dropped


def test_order_changes_with_the_epoch_and_is_reproducible():
    a0, a1 = epoch_of(64, 8, 2, epoch=0)[0], epoch_of(64, 8, 2, epoch=1)[0]
    assert a0 != a1
    assert a0 == epoch_of(64, 8, 2, epoch=0)[0]
    assert epoch_of(64, 8, 2, seed=1)[0] != a0


def test_advance_rolls_over_to_the_next_epoch():
    s = GlobalBatchSampler(50, 4, 2, 0, 0)  # 6 global batches of 8 per epoch
    for _ in range(6):
        s.advance()
    assert s.state_dict() == {"epoch": 1, "consumed": 0}


@pytest.mark.parametrize("old_world,new_world", [(4, 2), (2, 4), (3, 1)])
def test_resume_with_another_world_size_sees_each_sample_once(old_world, new_world):
    n, batch = 240, 5
    old = [GlobalBatchSampler(n, batch, old_world, r, 7) for r in range(old_world)]
    seen: list[int] = []
    iters = [s.epoch_indices() for s in old]
    for _ in range(3):  # three global batches, then the job is stopped
        for it in iters:
            seen += next(it)
        for s in old:
            s.advance()
    state = old[0].state_dict()
    new = [GlobalBatchSampler(n, batch, new_world, r, 7) for r in range(new_world)]
    for s in new:
        s.load_state_dict(state)
    for r, s in enumerate(new):
        seen += [i for b in s.epoch_indices() for i in b]
        del r
    assert len(seen) == len(set(seen))  # nothing twice
    tail = n - len(seen)
    assert 0 <= tail < batch * new_world  # nothing skipped but the final partial batch


def test_warmup_then_constant():
    assert lr_multiplier(0, 10, 100, "constant") == pytest.approx(0.1)
    assert lr_multiplier(9, 10, 100, "constant") == pytest.approx(1.0)
    assert lr_multiplier(10, 10, 100, "constant") == 1.0
    assert lr_multiplier(99, 10, 100, "constant") == 1.0
    assert lr_multiplier(0, 0, 100, "constant") == 1.0


def test_cosine_boundaries():
    assert lr_multiplier(10, 10, 110, "cosine") == pytest.approx(1.0)
    assert lr_multiplier(60, 10, 110, "cosine") == pytest.approx(0.5)
    assert lr_multiplier(110, 10, 110, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_multiplier(110, 10, 110, "cosine", min_ratio=0.1) == pytest.approx(0.1)
    steps = [lr_multiplier(s, 10, 110, "cosine") for s in range(10, 111)]
    assert all(a >= b for a, b in zip(steps, steps[1:], strict=False))


def test_lr_scaling_rules():
    assert scaled_lr(1e-3, "none", 512, 256) == 1e-3
    assert scaled_lr(1e-3, "linear", 512, 256) == pytest.approx(2e-3)
    assert scaled_lr(1e-3, "linear", 128, 256) == pytest.approx(5e-4)
    assert scaled_lr(1e-3, "sqrt", 1024, 256) == pytest.approx(2e-3)
    assert scaled_lr(1e-3, "sqrt", 512, 256) == pytest.approx(1e-3 * math.sqrt(2))


def test_precedence_defaults_file_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('name = "x"\n[train]\nlr = 0.5\nbatch_size = 8\n[slurm]\npartition = "gpu"\n')
    cfg, _ = parse_config(["--config", str(f), "--batch-size", "16"])
    assert (cfg.lr, cfg.batch_size, cfg.name, cfg.optimizer) == (0.5, 16, "x", "adamw")
    assert cfg.run_dir == "runs/x" and cfg.ckpt_dir == "runs/x/checkpoints"


def test_unknown_key_in_file_is_named(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'.*valid keys"):
        parse_config(["--config", str(f)])


def test_a_paced_step_sleeps_out_the_rest_of_its_time(monkeypatch):
    """DDPKIT_STEP_PACE_S (the drills' pace): a step that took 50 ms of a 200 ms pace sleeps
    the other 150; one that took longer than the pace does not sleep; unset or unreadable
    means no pace."""
    import time

    from ddpkit.train import drills

    for raw, want in [("0.2", 0.2), ("", 0.0), ("fast", 0.0), ("-1", 0.0)]:
        monkeypatch.setenv("DDPKIT_STEP_PACE_S", raw)
        assert drills.step_pace_s() == want
    slept: list[float] = []
    monkeypatch.setattr(drills.time, "sleep", slept.append)
    drills.pace(time.perf_counter() - 0.05, 0.2)
    assert len(slept) == 1 and 0.1 < slept[0] <= 0.15
    drills.pace(time.perf_counter() - 0.3, 0.2)
    assert len(slept) == 1


def test_a_paced_step_stops_sleeping_once_the_drill_writes_its_file(monkeypatch, tmp_path):
    """DDPKIT_STEP_PACE_UNTIL: the pace holds while the file is absent, and ends once the
    drill wrote it (a killed group healed): the steps left run at their own speed."""
    import time

    from ddpkit.train import drills

    slept: list[float] = []
    monkeypatch.setattr(drills.time, "sleep", slept.append)
    monkeypatch.setenv("DDPKIT_STEP_PACE_UNTIL", str(tmp_path / "healed"))
    drills.pace(time.perf_counter() - 0.05, 0.2)
    assert len(slept) == 1
    (tmp_path / "healed").write_text("")
    drills.pace(time.perf_counter() - 0.05, 0.2)
    assert len(slept) == 1


def test_the_logged_grad_norm_is_get_total_norms_bit_for_bit():
    """total_norm skips get_total_norm's grouping for one device and dtype (a logging step's
    cost on a small model); the value must not move by a bit, and mixed dtypes still work."""
    from ddpkit.train.loop.trainer import total_norm

    gen = torch.Generator().manual_seed(0)
    shapes = [(256, 784), (256,), (10, 256), (10,)]
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        grads = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
        assert torch.equal(total_norm(grads), torch.nn.utils.get_total_norm(grads))
    mixed = [torch.randn(3, generator=gen), torch.randn(3, generator=gen).double()]
    assert torch.equal(total_norm(mixed), torch.nn.utils.get_total_norm(mixed))
    assert float(total_norm([])) == 0.0
