"""The job's side of the step-time model: the parameter counts of the model's FSDP units, and
the compute of one micro-batch (from peak FLOPs x MFU, given, or measured here on the CPU)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from ddpkit.tools.planner.model import PlanError
from ddpkit.tools.planner.predict import Compute, ModelComm


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


def _measure(cfg: Any, reps: int, warmup: int) -> Compute:
    import torch
    import torch.nn.functional as F
    from ddpkit.tools.planner.model import _kind, in_shape
    from ddpkit.train.models import build_model

    torch.manual_seed(0)
    shape, classes = in_shape(cfg)
    model = build_model(cfg, shape, classes)
    if cfg.optimizer == "sgd":
        opt: Any = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = cfg.batch_size
    if _kind(cfg) == "tokens":
        x = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len))
        y = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len))
    else:
        x, y = torch.randn(b, *shape), torch.randint(0, classes, (b,))
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision)
    times: list[tuple[float, float, float]] = []
    for _ in range(warmup + reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=half, enabled=half is not None):
            out = model(x)
        loss = F.cross_entropy(out.flatten(0, -2).float(), y.flatten())
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    fwd, bwd, step = (statistics.median(t[i] for t in times[warmup:]) for i in range(3))
    threads = torch.get_num_threads()
    return Compute(fwd, bwd, step, b, f"measured here: CPU, {threads} thread(s), median of {reps}")
