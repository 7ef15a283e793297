"""Where a whole run's CPU goes, daemons included: the kernel's process accounting, summed.

tests/testcost.py counts what a pytest process and the children it waited for spent; the SLURM
jobs, podman's containers, the Kubernetes control plane and the S3 server are nobody's waited-for
children, so they are missing from it. The kernel's BSD process accounting (acct(2)) writes one
record for every process that ends, whoever started it, with its CPU time and parent:

    sudo .venv/bin/python -m tests.acct on /tmp/run.acct    # needs root (CAP_SYS_PACCT)
    make test                                                 # or CI=true bash .ci/run
    sudo .venv/bin/python -m tests.acct off
    .venv/bin/python -m tests.acct report /tmp/run.acct

`report` puts each process under the nearest ancestor that names a part of the run (GROUPS), or
under "the tests' own processes" (pytest, torchrun, the workers, `ddpkit`). A process still
running when accounting stops has no record. Records name the thread that ended last (a
torchrun worker is often `pt_gloo_runloop`), so only the daemons' names are matched.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): 64 bytes, times in AHZ (100 Hz) ticks.
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
AHZ = 100
OWN = "the tests' own processes (pytest, torchrun, workers, ddpkit, ...)"
# The first that names a process or an ancestor of it (a name prefix: the kernel keeps 15 chars).
GROUPS = (
    ("slurmstepd", "SLURM jobs (under slurmstepd)"),
    ("slurmctld", "SLURM daemons"),
    ("slurmd", "SLURM daemons"),
    ("conmon", "containers (under podman's conmon)"),
    ("podman", "podman itself"),
    ("kube-apiserver", "Kubernetes control plane"),
    ("kube-controller", "Kubernetes control plane"),
    ("etcd", "Kubernetes control plane"),
    ("training-operat", "Kubeflow controllers"),
    ("trainer-control", "Kubeflow controllers"),
    ("jobset-control", "Kubeflow controllers"),
    ("kubectl", "kubectl"),
    ("versitygw", "the S3 server"),
)


@dataclass
class Proc:
    pid: int
    ppid: int
    start: float  # seconds since the epoch
    end: float
    cpu: float  # user + system seconds
    comm: str


def comp_t(v: int) -> float:
    """The kernel's 16-bit comp_t: a 13-bit mantissa, a 3-bit base-8 exponent, in AHZ ticks."""
    return ((v & 0x1FFF) << (3 * (v >> 13))) / AHZ


def read(path: Path) -> list[Proc]:
    data, procs = path.read_bytes(), []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, off)
        if f[1] != 3:  # ac_version: v3 only
            continue
        start = float(f[8])
        comm = f[18].split(b"\0")[0].decode(errors="replace")
        procs.append(
            Proc(f[6], f[7], start, start + f[9] / AHZ, comp_t(f[10]) + comp_t(f[11]), comm)
        )
    return procs


def group_of(comm: str) -> str | None:
    return next((g for prefix, g in GROUPS if comm.startswith(prefix)), None)


def attribute(procs: list[Proc]) -> dict[str, tuple[float, int]]:
    """CPU seconds and process count per group. A parent is the process of the child's ppid
    whose life spans the child's start (pids are reused; starts are whole seconds)."""
    by_pid: dict[int, list[Proc]] = defaultdict(list)
    for p in procs:
        by_pid[p.pid].append(p)

    def parent(p: Proc) -> Proc | None:
        alive = [q for q in by_pid.get(p.ppid, []) if q.start - 1 <= p.start <= q.end + 1]
        return max(alive, key=lambda q: q.start) if alive else None

    out: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for p in procs:
        q, group, hops = p, None, 0
        while q is not None and group is None and hops < 64:
            group, q, hops = group_of(q.comm), parent(q), hops + 1
        key = group or OWN
        out[key][0] += p.cpu
        out[key][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def report(procs: list[Proc]) -> list[str]:
    groups = attribute(procs)
    total = sum(cpu for cpu, _ in groups.values())
    lines = [f"{len(procs)} processes ended, {total:.0f} CPU-s"]
    for name, (cpu, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        lines.append(
            f"{cpu:9.1f} CPU-s {cpu / total if total else 0:6.1%} {n:7d} processes  {name}"
        )
    return lines


def switch(path: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if path is not None:
        Path(path).touch()
    if libc.acct(path.encode() if path is not None else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path!r}): {os.strerror(err)} (it needs root)")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.acct", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("on").add_argument("file")
    sub.add_parser("off")
    sub.add_parser("report").add_argument("file")
    args = p.parse_args(argv)
    try:
        if args.cmd == "report":
            print("\n".join(report(read(Path(args.file)))))
        else:
            switch(args.file if args.cmd == "on" else None)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
