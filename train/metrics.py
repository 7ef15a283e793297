"""What a run reports: progress lines, metrics.jsonl, state bytes, parameter digests."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # DTensor shard, or the tensor


def _nbytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    t = _local(t)
    return t.numel() * t.element_size()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards)."""
    params = sum(_nbytes(p) for p in model.parameters())
    grads = sum(_nbytes(p.grad) for p in model.parameters())
    optim = sum(
        _nbytes(v)
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )
    return {"params": params, "grads": grads, "optim": optim, "total": params + grads + optim}


@torch.no_grad()
def param_digest(model: nn.Module) -> dict[str, Any]:
    """Sum, L2 norm and sha256 of the full (unsharded) fp32 parameters, in name order.

    Collective under FSDP (each DTensor is gathered): every rank must call it.
    """
    h = hashlib.sha256()
    total, sq = 0.0, 0.0
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        full = full.detach().float().cpu().contiguous()
        h.update(name.encode())
        h.update(full.numpy().tobytes())
        total += float(full.double().sum())
        sq += float(full.double().pow(2).sum())
    return {"sum": total, "l2": sq**0.5, "sha256": h.hexdigest()}


def gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class Reporter:
    """Rank 0's progress output and metric files; other ranks hold a silent instance."""

    def __init__(
        self, run_dir: Path, enabled: bool, total_steps: int, mode: str, tensorboard: bool
    ):
        self.enabled = enabled
        self.total = total_steps
        self.bar = enabled and (mode == "bar" or (mode == "auto" and sys.stdout.isatty()))
        self.file = open(run_dir / "metrics.jsonl", "a") if enabled else None  # noqa: SIM115
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise SystemExit(
                    "error: --tensorboard needs the tensorboard package: pip install tensorboard"
                ) from None
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def info(self, msg: str) -> None:
        if self.enabled:
            if self.bar:
                sys.stdout.write("\r\033[K")
            print(msg, flush=True)

    def log(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        assert self.file is not None
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, rec["step"])
        line = (
            f"step {rec['step']:>6}/{self.total} loss {rec['loss']:.4f} lr {rec['lr']:.3e} "
            f"gnorm {rec['grad_norm']:.3f} {rec['throughput']:.0f} {rec['throughput_unit']} "
            f"step {rec['step_time_s'] * 1000:.1f}ms mem {rec['mem_bytes'] / 2**20:.0f}MiB"
        )
        if self.bar:
            done = int(30 * rec["step"] / max(1, self.total))
            sys.stdout.write(f"\r\033[K[{'#' * done}{'.' * (30 - done)}] {line}")
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar:
            print()
        if self.file:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:  # resident set size of this process, from /proc (Linux)
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def cuda_memory(device: torch.device) -> dict[str, int]:
    """Peak CUDA memory allocated and reserved by this rank (empty on the CPU)."""
    if device.type != "cuda":
        return {}
    return {
        "max_mem_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "max_mem_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }


# Dense bf16 peak, TFLOP/s per GPU (vendor datasheets, without sparsity). For MFU; a device not
# listed needs --peak-tflops.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "V100": 125.0,
    "MI300X": 1307.0,
}


def peak_flops(device: torch.device, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # "A10G" is tried before "A10"
        if key in name:
            return PEAK_TFLOPS[key] * 1e12
    return None
