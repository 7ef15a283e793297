"""What `ddpkit run` costs over a plain torchrun launch of the same script (issue 34, launch).

    python -m bench.launch_overhead [--pairs 10] [--out-dir out/bench]
    python -m bench --only launch

A user's 5-step DDP script (2 gloo ranks, a tiny model: the launch dominates) is started both
ways from a project in a temporary directory, whole process, in pairs whose order alternates:

    plain   torchrun --standalone --nproc-per-node 2 train.py
    kit     ddpkit run            (the project's ddpkit.toml, written by `ddpkit init`: same
                                   script, nproc_per_node = 2)

CPU-seconds are the whole process tree's (user + system from os.wait4: the launcher, every
process it started and waited for, workers included); wall time is start to exit. Reported:
the median of the per-pair differences (kit - plain) and ratios (kit / plain), with p25..p75.
The goal (issue 34) is at most 0.3 CPU-seconds and 0.5 s of wall time over plain.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BenchError, clean_env, pairs_main, write_json

GOAL_CPU_S = 0.3
GOAL_WALL_S = 0.5

SCRIPT = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
open(f"done-{dist.get_rank()}", "w").close()  # this rank's work is done (see AbortedAtExit)
dist.destroy_process_group()
"""
RANKS = 2
RETRIES = 3  # launches lost to torch's exit-time abort a run may redo: this many, or one a pair


class AbortedAtExit(BenchError):
    """Every rank finished its steps, then one aborted (SIGABRT) as its interpreter exited:
    torch 2.14's gloo threads under CPU contention (train/teardown.py says how; the kit's
    launches wait it out, a plain torchrun launch cannot). Not a launch cost: the pair is redone
    and counted."""


def bin_of(name: str) -> str:
    """The console script beside this interpreter (the venv's torchrun and ddpkit)."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise BenchError(f"{path} not found: run from the project's venv (make setup)")
    return str(path)


def project(root: Path) -> Path:
    proj = root / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    r = subprocess.run([bin_of("ddpkit"), "init"], cwd=proj, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"ddpkit init failed: {r.stderr.strip()}")
    return proj


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole waited-for process tree) of one launch."""
    env = clean_env()
    for done in cwd.glob("done-*"):
        done.unlink()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        why = f"{' '.join(argv)} exited {proc.returncode}: {err.strip()[-400:]}"
        finished = all((cwd / f"done-{r}").exists() for r in range(RANKS))
        raise (AbortedAtExit if finished and "SIGABRT" in err else BenchError)(why)
    return wall, usage.ru_utime + usage.ru_stime


def spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2]}


def measure(pairs: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-launch-") as tmp:
        proj = project(Path(tmp))
        ways = {
            "plain": [
                bin_of("torchrun"),
                "--standalone",
                "--nproc-per-node",
                str(RANKS),
                "train.py",
            ],
            "kit": [bin_of("ddpkit"), "run"],
        }
        aborted: list[str] = []
        with contextlib.suppress(AbortedAtExit):
            timed(ways["plain"], proj)  # warm the page cache once, unrecorded
        while len(runs) < pairs:
            i = len(runs)
            order = ("plain", "kit") if i % 2 == 0 else ("kit", "plain")
            pair: dict[str, Any] = {}
            try:
                for way in order:
                    wall, cpu = timed(ways[way], proj)
                    pair[way] = {"wall_s": wall, "cpu_s": cpu}
            except AbortedAtExit as e:
                aborted.append(str(e))
                if len(aborted) > max(RETRIES, pairs):
                    raise
                continue
            runs.append(pair)
    diff = {k: [p["kit"][k] - p["plain"][k] for p in runs] for k in ("wall_s", "cpu_s")}
    ratio = {k: [p["kit"][k] / p["plain"][k] for p in runs] for k in ("wall_s", "cpu_s")}
    return {
        "pairs": runs,
        "aborted_at_exit": aborted,  # launches redone (AbortedAtExit), their error tails
        "commands": {"plain": "torchrun --standalone --nproc-per-node 2 train.py",
                     "kit": "ddpkit run  (ddpkit.toml from ddpkit init, nproc_per_node = 2)"},
        "over_plain": {k: spread(v) for k, v in diff.items()},
        "ratio": {k: spread(v) for k, v in ratio.items()},
        "plain": {k: spread([p["plain"][k] for p in runs]) for k in ("wall_s", "cpu_s")},
    }  # fmt: skip


def lines(result: dict[str, Any]) -> list[str]:
    over, ratio, n = result["over_plain"], result["ratio"], len(result["pairs"])
    out = [f"launch: ddpkit run vs torchrun --standalone, user's 5-step DDP script, {n} pairs"]
    if result.get("aborted_at_exit"):
        out.append(
            f"  {len(result['aborted_at_exit'])} launch(es) aborted at exit after every"
            " rank's steps (torch's gloo teardown; see train/teardown.py): pair redone"
        )
    for key, goal, unit in (("cpu_s", GOAL_CPU_S, "CPU-s"), ("wall_s", GOAL_WALL_S, "s wall")):
        o, r = over[key], ratio[key]
        met = "met" if o["median"] <= goal else "NOT met"
        out.append(
            f"  {unit:7} kit - plain {o['median']:+.2f} (p25..p75 {o['p25']:+.2f}..{o['p75']:+.2f}),"
            f" ratio {r['median']:.3f}; plain {result['plain'][key]['median']:.2f};"
            f" goal <= {goal} over: {met}"
        )
    return out


def run(pairs: int, out: Path, env: dict[str, Any]) -> list[str]:
    result = measure(pairs)
    write_json(out / "launch.json", {"env": env, **result})
    return lines(result)


def main(argv: list[str] | None = None) -> int:
    return pairs_main(argv, "python -m bench.launch_overhead", __doc__, 10, run)


if __name__ == "__main__":
    sys.exit(main())
