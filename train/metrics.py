"""What a run reports: progress lines, metrics.jsonl, state bytes, parameter digests."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train import goodput, observe, trainjob_status
from ddpkit.train.contract import METRICS_FILE
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


class _TensorBoard:
    def __init__(self, run_dir: Path, cfg: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(str(run_dir / "tensorboard"))
        self.w.add_text("config", "```\n" + json.dumps(cfg, indent=2) + "\n```")

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        self.w.close()


class _WandB:
    """W&B run named after the run; WANDB_PROJECT/WANDB_MODE etc. from the environment."""

    def __init__(self, run_dir: Path, cfg: dict[str, Any]):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "ddpkit"),
            name=cfg.get("name"),
            dir=str(run_dir),
            config=cfg,
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    """An MLflow run; MLFLOW_TRACKING_URI wins, else a SQLite store in the run dir."""

    def __init__(self, run_dir: Path, cfg: dict[str, Any]):
        import logging

        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no per-run INFO chatter
        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "ddpkit"))
        self.run = mlflow.start_run(run_name=cfg.get("name"))
        mlflow.log_params({k: str(v)[:500] for k, v in cfg.items()})

    def log(self, values: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


# One class per name in ddpkit.train.config.LOG_BACKENDS; imported on rank 0 only, when chosen.
_BACKEND_CLASSES = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class Reporter:
    """Rank 0's progress output, metrics.jsonl and logging backends; a silent one elsewhere.

    On a terminal (or --progress bar) a tqdm bar shows steps, elapsed time, ETA and the last
    metric line; messages print above it. Otherwise every logged step is one plain line.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        total_steps: int,
        mode: str,
        backends: list[str] | tuple[str, ...] = (),
        config: dict[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.total = total_steps
        self.bar = None
        if enabled and (mode == "bar" or (mode == "auto" and sys.stdout.isatty())):
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_steps, unit="step", file=sys.stdout, dynamic_ncols=True, leave=True
            )
        self.file = open(run_dir / METRICS_FILE, "a") if enabled else None  # noqa: SIM115
        self._since: tuple[float, int] | None = None  # (monotonic time, step) of the first log
        self.backends = (
            [_BACKEND_CLASSES[b](run_dir, config or {}) for b in backends] if enabled else []
        )
        # What else hears each logged step (log(rec), close()): the TrainJob's own status
        # where Kubeflow Trainer offers its status server (trainjob_status.py).
        status = trainjob_status.from_env(run_dir, total=total_steps) if enabled else None
        self.sinks: list[Any] = [status] if status else []
        # Told each logging step's record with every rank's step time, the goodput at the
        # end, and the close: the run's Prometheus figures (train/observe/).
        self.observers: list[Any] = []
        if enabled:
            world = int(os.environ.get("WORLD_SIZE") or 1)
            self.observe(observe.start(run_dir, total_steps, world, self.info, goodput))

    def observe(self, observer: Any) -> None:
        """Add an observer (on_log(record, ranks' step times), on_goodput(report), close())."""
        if self.enabled and observer is not None:
            self.observers.append(observer)

    def info(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(msg, flush=True)

    def tick(self, step: int) -> None:
        """Move the bar to `step` (every step; tqdm redraws at most ~10 times a second)."""
        if self.bar is None:
            return
        if self.bar.n == 0 and step > 1:  # resumed: the rate and ETA count from here
            self.bar.reset(total=self.total)
            self.bar.update(step - 1)
            self.bar.last_print_n = self.bar.n
            self.bar.start_t = self.bar.last_print_t = self.bar._time()
        self.bar.update(step - self.bar.n)

    def _write(self, rec: dict[str, Any]) -> None:
        assert self.file is not None
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        values = {
            k: float(v)
            for k, v in rec.items()
            if k not in ("step", "eta_s", "total_steps", "slowest_rank")
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
        }
        for b in self.backends:
            b.log(values, rec["step"])

    def eta_s(self, step: int) -> float | None:
        """Seconds to the last step at the pace since the first logged step of this process
        (a resumed run counts from its own start); None until a pace is known."""
        now = time.monotonic()
        if self._since is None or step <= self._since[1]:
            self._since = self._since or (now, step)
            return None
        t0, s0 = self._since
        return max(0.0, (now - t0) / (step - s0) * (self.total - step))

    def log(self, rec: dict[str, Any], ranks: list[float] | None = None) -> None:
        """A logging step's record; ranks: each rank's step time (index = rank)."""
        if not self.enabled:
            return
        rec = {**rec, "total_steps": self.total}  # the progress bar of `ddpkit status --watch`
        if ranks and len(ranks) > 1:  # the slowest rank, for `ddpkit status` and a pod's log
            slow = max(range(len(ranks)), key=ranks.__getitem__)
            rec.update(slowest_rank=slow, step_time_max_s=ranks[slow])
        eta = self.eta_s(rec["step"])
        if eta is not None:  # for the launcher's status line (`WAIT=1`): step and ETA
            rec["eta_s"] = round(eta, 1)
        self._write(rec)
        for o in self.observers:
            o.on_log(rec, ranks)
        for sink in self.sinks:
            sink.log(rec)
        values = (
            f"loss {rec['loss']:.4f} lr {rec['lr']:.3e} "
            f"gnorm {rec['grad_norm']:.3f} {rec['throughput']:.0f} {rec['throughput_unit']} "
            f"step {rec['step_time_s'] * 1000:.1f}ms mem {rec['mem_bytes'] / 2**20:.0f}MiB"
        )
        if self.bar is not None:  # the bar shows the step count, elapsed time and ETA itself
            self.tick(rec["step"])
            self.bar.set_postfix_str(values, refresh=True)
        else:
            eta = f" eta {format_duration(rec['eta_s'])}" if "eta_s" in rec else ""
            if "slowest_rank" in rec:
                values += (
                    f" slowest rank {rec['slowest_rank']} {rec['step_time_max_s'] * 1e3:.1f}ms"
                )
            print(f"step {rec['step']:>6}/{self.total} {values}{eta}", flush=True)

    def log_eval(self, rec: dict[str, Any]) -> None:
        """A held-out evaluation: its own record in metrics.jsonl (eval_* keys, no loss)."""
        if not self.enabled:
            return
        self._write(rec)
        acc = f" accuracy {rec['eval_accuracy']:.4f}" if "eval_accuracy" in rec else ""
        self.info(f"eval at step {rec['step']}: loss {rec['eval_loss']:.4f}{acc}")

    def log_goodput(self, step: int, rep: Any) -> None:
        """The run's goodput so far (a train.goodput.Report), to the logging backends
        (TensorBoard, W&B, MLflow) as scalars. Not to metrics.jsonl: its lines are the steps'
        and evaluations' records, which readers take the last line of; the report itself is in
        summary.json["goodput"] and <run dir>/goodput.json."""
        if not self.enabled or rep is None:
            return
        d = rep.to_dict()
        keys = ("goodput", "wall_s", "productive_s", "lost_s", "ckpt_blocking_s", "attempts")
        values = {f"goodput/{k}": float(d[k]) for k in keys if d.get(k) is not None}
        values["goodput/failures"] = float(len(rep.failures))
        for b in self.backends:
            b.log(values, step)
        for o in self.observers:
            o.on_goodput(rep)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.file:
            self.file.close()
            self.file = None
        for b in self.backends:
            b.close()
        self.backends = []
        for o in self.observers:
            o.close()
        self.observers = []
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def format_duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m: what a progress line needs, no more."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _rss_bytes()


_statm: dict[str, int] = {}  # this process's open /proc/self/statm: pid, fd, page size


def _rss_bytes() -> int:
    """The resident set size of this process, from /proc (Linux; 0 elsewhere). The file is
    opened once per process and read with pread: an open per logging step cost ~70 us of
    a few-ms step."""
    try:
        if _statm.get("pid") != os.getpid():  # first call, or a forked child (its own file)
            fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            _statm.update(pid=os.getpid(), fd=fd, page=os.sysconf("SC_PAGE_SIZE"))
        return int(os.pread(_statm["fd"], 128, 0).split()[1]) * _statm["page"]
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
