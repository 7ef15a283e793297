"""Submit to first step on the local SLURM cluster: `ddpkit submit slurm` against a plain
`sbatch` of a hand-written `srun torchrun` script of the same user script (issue 34, submit).

    python -m bench.submit_latency [--pairs 3] [--out-dir out/bench]
    python -m bench --only submit

Needs the local SLURM cluster up (`make slurm-up`; it is never started or stopped here). A
user's 5-step DDP script (2 gloo ranks on one node) is submitted both ways from a project in a
temporary directory under the shared filesystem, in pairs whose order alternates:

    plain   sbatch job.sbatch    #SBATCH --nodes=1 --ntasks-per-node=1 --cpus-per-task=2
                                 srun torchrun --standalone --nproc-per-node 2 train.py
    kit     ddpkit submit slurm  (ddpkit.toml: script = "train.py", nproc_per_node = 2,
                                 cpus_per_proc = 1, accelerator = "cpu")

First step: rank 0 writes the wall-clock time its first optimizer step ended into a file
(this machine is every node of the local cluster: one clock). Reported: submit to first step
for each way, the median of the per-pair differences (kit - plain) with p25..p75, and the
time the submitting command itself took. The goal (issue 34) is at most 2 s over plain. A
pair waits for both jobs to end before the next one starts; other users' jobs on the cluster
may still delay either way's start (the pairs alternate so a busy spell hits both).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BenchError, clean_env, pairs_main, write_json
from bench.launch_overhead import bin_of, spread

GOAL_S = 2.0
JOB_TIMEOUT_S = 300

SCRIPT = """\
import sys, time
mark = sys.argv[sys.argv.index("--mark") + 1]
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
    if step == 0 and dist.get_rank() == 0:
        with open(mark + ".first", "w") as f:
            f.write(repr(time.time()))
dist.destroy_process_group()
"""

JOB = (
    'name = "bench"\nnproc_per_node = 2\ncpus_per_proc = 1\naccelerator = "cpu"\n'
    'script = "train.py"\ntime = "00:10:00"\n'
)

SBATCH = """\
#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=10
#SBATCH --output={proj}/slurm-%x-%j.out
#SBATCH --chdir={proj}
srun --cpus-per-task=2 {torchrun} --standalone --nproc-per-node 2 train.py --mark "$1"
"""


def cluster_up() -> None:
    for tool in ("sbatch", "squeue", "sinfo"):
        if shutil.which(tool) is None:
            raise BenchError(
                f"{tool} not found: the SLURM bench needs the local cluster (make slurm-up)"
            )
    r = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or "up" not in r.stdout:
        raise BenchError("no SLURM partition answers: start the local cluster (make slurm-up)")


def project(root: Path) -> Path:
    proj = root / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "ddpkit.toml").write_text(JOB)
    (proj / "job.sbatch").write_text(
        SBATCH.format(name="{name}", proj=proj, torchrun=bin_of("torchrun"))
    )
    return proj


def queued(name: str) -> bool:
    r = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    return r.returncode != 0 or bool(r.stdout.strip())


def submit_once(way: str, proj: Path, name: str) -> dict[str, float]:
    """Submit one job, wait for its first step and its end: seconds from the submit command's
    start to its return and to the first step."""
    mark = proj / "marks" / name
    mark.parent.mkdir(exist_ok=True)
    if way == "plain":
        script = proj / f"{name}.sbatch"
        script.write_text((proj / "job.sbatch").read_text().replace("{name}", name))
        argv = ["sbatch", "--parsable", str(script), str(mark)]
    else:
        argv = [bin_of("ddpkit"), "submit", "slurm", "--set", f"name={name}", "--", "--mark",
                str(mark)]  # fmt: skip
    start = time.time()
    r = subprocess.run(argv, cwd=proj, env=clean_env(), capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S)  # fmt: skip
    returned = time.time() - start
    if r.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    first = mark.with_name(mark.name + ".first")
    deadline = start + JOB_TIMEOUT_S
    while not first.exists() or not first.read_text():
        if time.time() > deadline:
            raise BenchError(f"{way} job {name} wrote no first step in {JOB_TIMEOUT_S} s")
        time.sleep(0.05)
    first_step = float(first.read_text()) - start
    while queued(name):  # the next submit starts on a cluster this job has left
        if time.time() > deadline:
            raise BenchError(f"{way} job {name} did not end in {JOB_TIMEOUT_S} s")
        time.sleep(0.5)
    return {"submit_returned_s": returned, "first_step_s": first_step}


def measure(pairs: int) -> dict[str, Any]:
    cluster_up()
    runs: list[dict[str, Any]] = []
    tag = f"{os.getpid()}"
    # /tmp is the cluster's shared filesystem here (every node is this machine)
    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-submit-") as tmp:
        proj = project(Path(tmp))
        submit_once("plain", proj, f"bsub-warm-{tag}")  # page cache and the nodes' first start
        for i in range(pairs):
            order = ("plain", "kit") if i % 2 == 0 else ("kit", "plain")
            runs.append({way: submit_once(way, proj, f"bsub-{way}-{tag}-{i}") for way in order})
    keys = ("first_step_s", "submit_returned_s")
    diff = {k: [p["kit"][k] - p["plain"][k] for p in runs] for k in keys}
    return {
        "pairs": runs,
        "commands": {"plain": "sbatch job.sbatch (srun torchrun --standalone --nproc-per-node 2 train.py)",
                     "kit": "ddpkit submit slurm (ddpkit.toml: script = train.py, nproc_per_node = 2)"},
        "over_plain": {k: spread(v) for k, v in diff.items()},
        "plain": {k: spread([p["plain"][k] for p in runs]) for k in keys},
        "kit": {k: spread([p["kit"][k] for p in runs]) for k in keys},
    }  # fmt: skip


def lines(result: dict[str, Any]) -> list[str]:
    n, over = len(result["pairs"]), result["over_plain"]
    out = [
        f"submit (SLURM, local cluster): ddpkit submit slurm vs sbatch + srun torchrun, {n} pairs"
    ]
    for key, what in (("first_step_s", "to first step"), ("submit_returned_s", "command returned")):
        o, p, k = over[key], result["plain"][key], result["kit"][key]
        goal = ""
        if key == "first_step_s":
            goal = f"; goal <= {GOAL_S} s over: {'met' if o['median'] <= GOAL_S else 'NOT met'}"
        out.append(
            f"  {what:16} plain {p['median']:.2f} s, kit {k['median']:.2f} s; kit - plain"
            f" {o['median']:+.2f} (p25..p75 {o['p25']:+.2f}..{o['p75']:+.2f}){goal}"
        )
    return out


def run(pairs: int, out: Path, env: dict[str, Any]) -> list[str]:
    result = measure(pairs)
    write_json(out / "submit.json", {"env": env, **result})
    return lines(result)


def main(argv: list[str] | None = None) -> int:
    return pairs_main(argv, "python -m bench.submit_latency", __doc__, 3, run)


if __name__ == "__main__":
    sys.exit(main())
