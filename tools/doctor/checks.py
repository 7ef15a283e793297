"""The doctor's checks: each returns Findings (level, what it saw, how to fix it).

The rules that decide are small functions over plain values (`shm_finding(total, gpus)`)
so tests can feed them any machine; the `check_*` wrappers read this node. Network checks
(interfaces, InfiniBand, rendezvous) are in tools/doctor/net.py.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.train.contract import is_remote

MiB, GiB = 2**20, 2**30
LEVELS = ("ok", "info", "warn", "fail")


@dataclass
class Finding:
    check: str
    level: str  # ok | info | warn | fail (fail = the job will not work)
    message: str
    fix: str | None = None
    scope: str = "node"  # node: the same for every rank on a host; rank: this process only
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- versions and GPUs ---------------------------------------------------------------------


def check_versions() -> list[Finding]:
    import torch

    cuda = torch.version.cuda or "none (CPU build)"
    nccl = "n/a"
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            nccl = "unavailable"
    data = {"python": platform.python_version(), "torch": torch.__version__, "cuda": cuda}
    data["nccl"] = nccl
    msg = f"python {data['python']}, torch {data['torch']}, CUDA {cuda}, NCCL {nccl}"
    out = [Finding("versions", "info", msg, data=data)]
    if not torch.cuda.is_available() and Path("/dev/nvidia0").exists():
        out.append(
            Finding(
                "versions",
                "fail",
                "/dev/nvidia0 exists but torch sees no GPU",
                "install a CUDA build of torch that matches the driver (nvidia-smi shows the "
                "driver's CUDA version); in a container run with --gpus all / the nvidia runtime",
            )
        )
    return out


def gpu_finding(
    count: int, visible: str | None, local_rank: int, local_world: int
) -> list[Finding]:
    """GPU count against CUDA_VISIBLE_DEVICES and the ranks on this node."""
    out = []
    shown = "unset" if visible is None else repr(visible)
    if count == 0:
        level = (
            "warn"
            if visible is not None and visible.strip() in ("", "-1", "NoDevFiles")
            else "info"
        )
        fix = "unset CUDA_VISIBLE_DEVICES or list the GPU indices" if level == "warn" else None
        out.append(
            Finding(
                "gpus", level, f"no GPU visible (CUDA_VISIBLE_DEVICES {shown}): gloo on CPU", fix
            )
        )
        return out
    listed = [v for v in (visible or "").split(",") if v.strip()]
    out.append(Finding("gpus", "ok", f"{count} GPU(s) visible (CUDA_VISIBLE_DEVICES {shown})"))
    if visible is not None and len(listed) > count:
        out.append(
            Finding(
                "gpus",
                "warn",
                f"CUDA_VISIBLE_DEVICES lists {len(listed)} devices but {count} exist",
                "list only existing GPU indices or UUIDs (nvidia-smi -L)",
            )
        )
    if local_world > count:
        out.append(
            Finding(
                "gpus",
                "fail",
                f"{local_world} ranks on this node but {count} GPU(s): rank {local_rank} has no GPU "
                "of its own (NCCL fails with 'Duplicate GPU detected')",
                f"start one process per GPU: torchrun --nproc-per-node {count}",
                scope="rank",
            )
        )
    return out


def check_gpus(local_rank: int, local_world: int) -> list[Finding]:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpu_finding(count, os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank, local_world)


# --- /dev/shm, limits, disk -----------------------------------------------------------------


def shm_finding(total: int | None, gpus: int) -> Finding:
    """NCCL puts its intra-node buffers in /dev/shm and DataLoader workers pass batches
    through it; a container's default 64 MB ends in bus errors."""
    fix = (
        "docker/podman run --ipc=host (or --shm-size=16g); Kubernetes: mount an emptyDir "
        "{medium: Memory} at /dev/shm; SLURM sites: ask for a larger /dev/shm"
    )
    if total is None:
        return Finding("shm", "fail", "/dev/shm does not exist", fix)
    size = f"/dev/shm is {total / MiB:.0f} MiB"
    if total < 512 * MiB and gpus > 1:
        return Finding("shm", "fail", f"{size}: too small for NCCL between {gpus} local GPUs", fix)
    if total < 1 * GiB:
        return Finding(
            "shm", "warn", f"{size}: DataLoader workers (--num-workers) may hit bus errors", fix
        )
    return Finding("shm", "ok", size)


def check_shm(gpus: int) -> Finding:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return shm_finding(None, gpus)
    return shm_finding(st.f_blocks * st.f_frsize, gpus)


def limits_findings(memlock: int, nofile: int, ib: bool, gpus: int) -> list[Finding]:
    out = []
    unlimited = memlock == resource.RLIM_INFINITY
    shown = "unlimited" if unlimited else f"{memlock // 1024} KiB"
    fix = "ulimit -l unlimited (limits.conf memlock, or docker --ulimit memlock=-1:-1)"
    if not unlimited and ib:
        out.append(
            Finding("memlock", "fail", f"memlock {shown}: RDMA cannot pin NCCL's buffers", fix)
        )
    elif not unlimited and gpus > 0 and memlock < 64 * MiB:
        out.append(
            Finding("memlock", "warn", f"memlock {shown}: pinned host memory is limited", fix)
        )
    else:
        out.append(Finding("memlock", "ok", f"memlock {shown}"))
    if nofile != resource.RLIM_INFINITY and nofile < 4096:
        out.append(
            Finding(
                "nofile",
                "warn",
                f"open files limit {nofile}: DataLoader workers and many ranks run out of descriptors",
                "ulimit -n 65536 (or raise nofile in limits.conf / docker --ulimit nofile=65536)",
            )
        )
    else:
        out.append(Finding("nofile", "ok", f"open files limit {nofile}"))
    return out


def disk_finding(path: Path, free: int, writable: bool, need: int | None) -> Finding:
    where = f"checkpoint path {path}"
    if not writable:
        return Finding(
            "disk",
            "fail",
            f"{where} is not writable by this user",
            "point --ckpt-dir at shared storage you can write (the same path on every node)",
        )
    msg = f"{free / GiB:.1f} GiB free at {where}"
    fix = "free space, or point --ckpt-dir at a larger (shared) filesystem"
    if need is not None and free < need:
        return Finding(
            "disk", "fail", f"{msg}; the kept checkpoints need ~{need / GiB:.1f} GiB", fix
        )
    if free < 1 * GiB:
        return Finding("disk", "fail", msg, fix)
    if free < 10 * GiB:
        return Finding("disk", "warn", msg, fix)
    return Finding("disk", "ok", msg)


def check_disk(path: str, need: int | None) -> Finding:
    if is_remote(path):  # a store's saves are staged on this machine's disk first
        from ddpkit.train.ckpt.store import local_dir

        path = str(local_dir(path))
    p = Path(path).absolute()
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    return disk_finding(p, usage.free, os.access(existing, os.W_OK), need)


# --- across nodes ---------------------------------------------------------------------------


def skew_finding(times: dict[str, float]) -> Finding:
    """Host -> its clock read right after a barrier. Log timestamps, munge (SLURM auth) and
    TLS break when node clocks drift apart."""
    if len(times) < 2:
        return Finding("clock", "info", "one node: no clock skew to measure")
    ref = min(times.values())
    worst_host, worst = max(((h, t - ref) for h, t in times.items()), key=lambda x: x[1])
    msg = f"max clock difference between nodes {worst * 1000:.0f} ms ({worst_host})"
    if worst > 1.0:
        return Finding(
            "clock", "warn", msg, "run chrony/ntpd on every node", data={"skew_s": worst}
        )
    return Finding("clock", "ok", msg, data={"skew_s": worst})
