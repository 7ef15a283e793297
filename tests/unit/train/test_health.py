"""The divergence check's bookkeeping (train/fault.py Health): kept values, windows, flags.

A step only hands its loss (and grad norm) over; the first bad step must still come out
exact, across windows, for a bad grad norm under a finite loss, and for a step a torchft
group retried. In process, a one-rank gloo group for check()'s all-reduce."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from ddpkit.train.divergence import Diverged, Health

NAN, INF = float("nan"), float("inf")


def t(v: float) -> torch.Tensor:
    return torch.tensor(v)


def feed(
    h: Health, losses: dict[int, float], steps: range, gnorms: dict[int, float] | None = None
) -> None:
    for s in steps:
        g = (gnorms or {}).get(s)
        h.observe(s, t(losses.get(s, 1.0)), None if g is None else t(g))


def flagged(h: Health) -> bool:
    kept, bad = h.flags()
    return Health.flagged(float(kept), float(bad))


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_finite_steps_flag_nothing_across_many_windows(one_rank):
    h = Health(torch.device("cpu"), 0)
    feed(h, {}, range(1, 3 * Health.WINDOW + 5), gnorms={10: 3.0, 100: 0.5})
    assert not flagged(h)
    h.check()  # no Diverged


@pytest.mark.parametrize("bad_step", [1, 5, Health.WINDOW, Health.WINDOW + 1, 150])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_the_first_bad_step_is_named_exactly_wherever_it_falls(one_rank, bad_step, value):
    h = Health(torch.device("cpu"), 0)
    feed(h, {bad_step: value, bad_step + 7: NAN}, range(1, 200))
    assert flagged(h)
    with pytest.raises(Diverged) as e:
        h.check()
    assert e.value.step == bad_step


def test_a_bad_grad_norm_under_a_finite_loss_is_caught(one_rank):
    h = Health(torch.device("cpu"), 0)
    feed(h, {}, range(1, 21), gnorms={10: 1.0, 20: INF})
    assert flagged(h)
    with pytest.raises(Diverged) as e:
        h.check()
    assert e.value.step == 20


def test_a_retried_step_keeps_its_bad_first_attempt(one_rank):
    """torchft: a group that could not commit step 6 runs step 6 again; the bad attempt
    still counts (as before: the step is named, the run stops)."""
    h = Health(torch.device("cpu"), 0)
    feed(h, {6: NAN}, range(1, 7))
    feed(h, {}, range(6, 12))  # step 6 again, finite this time, and on
    with pytest.raises(Diverged) as e:
        h.check()
    assert e.value.step == 6


def test_a_fold_keeps_the_verdict_for_later_logging_steps(one_rank):
    """After the window with the bad step was folded, the flags still say so."""
    h = Health(torch.device("cpu"), 0)
    feed(h, {3: NAN}, range(1, Health.WINDOW + 10))  # step 65 folded the first window
    kept, bad = h.flags()
    assert math.isfinite(float(kept)) and float(bad) == 1.0
    assert flagged(h)


def test_large_finite_losses_may_flag_but_check_is_exact(one_rank):
    """Finite values whose sum overflows float32 raise the flag (a second look costs one
    all-reduce); check() itself finds no bad step."""
    h = Health(torch.device("cpu"), 0)
    feed(h, {2: 3e38, 3: 3e38}, range(1, 5))
    assert flagged(h)
    h.check()  # no Diverged


def test_steps_after_a_retry_keep_their_own_numbers(one_rank):
    h = Health(torch.device("cpu"), 0)
    feed(h, {}, range(1, 7))
    feed(h, {9: NAN}, range(6, 12))  # step 6 retried; the NaN is step 9's
    with pytest.raises(Diverged) as e:
        h.check()
    assert e.value.step == 9
