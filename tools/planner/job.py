"""The job's side of the step-time model: the parameter counts of the model's FSDP units, and
the compute of one micro-batch (from peak FLOPs x MFU, given, or measured here on the CPU)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from ddpkit.tools.planner.model import PlanError
from ddpkit.tools.planner.predict import Compute, ModelComm
from ddpkit.train.errors import UserError


def model_comm(cfg: Any, dtype: str) -> ModelComm:
    """Parameter counts of the FSDP units of the job's model, built on the meta device."""
    from ddpkit.tools.planner.dryrun import build_model
    from ddpkit.tools.planner.model import _kind
    from ddpkit.train.resolve import find_blocks

    model = build_model(cfg)
    blocks = find_blocks(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    return ModelComm(
        params=sum(p.numel() for p in model.parameters()),
        root_params=sum(p.numel() for p in model.parameters() if id(p) not in in_blocks),
        block_params=[sum(p.numel() for p in b.parameters()) for b in blocks],
        param_bytes=2 if dtype in ("bf16", "fp16") else 4,
        tokens_per_sample=cfg.seq_len if _kind(cfg) == "tokens" else 0,
    )


def compute_from_flops(cfg: Any, peak_tflops: float, mfu: float) -> Compute:
    """One micro-batch at peak x MFU with the registry's training FLOPs per token (forward :
    backward = 1 : 2, the 2N + 4N of the 6N rule); the optimizer step is not counted."""
    from ddpkit.tools.planner.dryrun import build_model
    from ddpkit.train import resolve

    spec = resolve.model_spec(cfg)
    if spec.flops_per_token is None or resolve.model_spec(cfg).data_kind != "tokens":
        raise PlanError(
            f"--mfu needs the model's FLOPs per token; {cfg.model} registers none: drop --mfu "
            "to measure one step here, or pass --compute-s"
        )
    fpt = spec.flops_per_token(cfg, build_model(cfg))
    seconds = fpt * cfg.batch_size * cfg.seq_len / (peak_tflops * 1e12 * mfu)
    src = f"{peak_tflops:g} TFLOP/s x MFU {mfu:g}, {fpt / 1e9:.3g} GFLOP per token"
    return Compute(seconds / 3, 2 * seconds / 3, 0.0, cfg.batch_size, src)


def compute_given(cfg: Any, seconds: float) -> Compute:
    return Compute(seconds / 3, 2 * seconds / 3, 0.0, cfg.batch_size, f"given: {seconds:g} s")


def measure_compute(cfg: Any, reps: int = 5, warmup: int = 2) -> Compute:
    """Forward, backward and optimizer step of the job's model on this CPU, one micro-batch
    (median of `reps` after `warmup`), in this process's torch thread count."""
    from ddpkit.tools.planner.model import cannot_run

    try:  # the user's model on the input the planner has: what it cannot run is one line
        return _measure(cfg, reps, warmup)
    except Exception as e:
        raise cannot_run(cfg, e) from None


def stand_in_targets(out: Any) -> Any:
    """Targets for the job's loss from what the model outputs: class indices below its last
    size, one per row ((N, C) -> (N,), tokens (N, T, V) -> (N, T)). Not the dataset's class
    count: a user's model with 4 outputs gets targets 0..3."""
    import torch

    return torch.randint(0, out.shape[-1], out.shape[:-1])


def _measure(cfg: Any, reps: int, warmup: int) -> Compute:
    import torch
    from ddpkit.tools.planner.model import _kind, in_shape
    from ddpkit.train import resolve
    from ddpkit.train.models import build_model

    torch.manual_seed(0)
    shape, classes = in_shape(cfg)
    model = build_model(cfg, shape, classes)
    loss_fn = resolve.loss_fn(cfg)
    if cfg.optimizer == "sgd":
        opt: Any = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = cfg.batch_size
    if _kind(cfg) == "tokens":
        x = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len))
    else:
        x = torch.randn(b, *shape)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision)
    y = None
    times: list[tuple[float, float, float]] = []
    for _ in range(warmup + reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=half, enabled=half is not None):
            out = model(x)
        if y is None:
            y = stand_in_targets(out)
        loss = _loss(cfg, loss_fn, out, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    fwd, bwd, step = (statistics.median(t[i] for t in times[warmup:]) for i in range(3))
    threads = torch.get_num_threads()
    return Compute(fwd, bwd, step, b, f"measured here: CPU, {threads} thread(s), median of {reps}")


def _loss(cfg: Any, loss_fn: Any, out: Any, y: Any) -> Any:
    """The job's loss on the stand-in targets; a loss that wants other targets is one line
    (the input was fine: the forward ran)."""
    try:
        return loss_fn(out, y)
    except UserError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PlanError(
            f"--model {cfg.model}: its loss ({cfg.loss or 'cross_entropy'}) fails on the "
            f"planner's stand-in targets, class indices below the output's last size "
            f"{out.shape[-1]} ({type(e).__name__}: {first}); time one step of the real job "
            "and pass it with --compute-s S"
        ) from None
