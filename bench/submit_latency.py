"""Submit to first step, the kit against the plain route of the same user script (issue 34,
submit), on the local SLURM cluster and on a local Kubernetes control plane; on SLURM also
against torchx's SLURM scheduler when torchx is installed (`pip install -e '.[bench]'`).

    python -m bench.submit_latency [--backend slurm|k8s] [--pairs 3] [--out-dir out/bench]
    python -m bench --only submit                # both

A user's 5-step DDP script (2 gloo ranks on one node) is submitted each way from a project in
a temporary directory, in pairs (triples with torchx) whose order rotates, so no way is always
first:

  SLURM (needs the local cluster up, `make slurm-up`; never started or stopped here)
    plain   sbatch job.sbatch    #SBATCH --nodes=1 --ntasks-per-node=1 --cpus-per-task=2
                                 srun torchrun --standalone --nproc-per-node 2 train.py
    kit     ddpkit submit slurm  (ddpkit.toml: script = "train.py", nproc_per_node = 2,
                                 cpus_per_proc = 1, accelerator = "cpu")
    torchx  torchx run --scheduler slurm -cfg time=10 dist.ddp -j 1x2 --cpu 2 --script train.py
            (its sbatch script: --ntasks-per-node=1 --cpus-per-task=2 --mem=1024, then
            srun bash -c 'torchrun --rdzv_backend c10d --rdzv_endpoint localhost:0 ...');
            without torchx this way is skipped with one line. On Slurm 22.05 torchx run exits 1
            after submitting (its status query: squeue --json has no job_resources for a pending
            job); a run that printed its handle counts, and the report says how many did so
  Kubernetes (a private one-node control plane, k8s/local/up.sh, started and removed here; the
  image `bench:1` is this venv with the project as /workspace, as `ddpkit build` makes it)
    plain   kubectl apply -f job.json   a hand-written PyTorchJob: one Master replica running
                                        torchrun --standalone --nproc-per-node 2 train.py
    kit     ddpkit submit k8s           (the same ddpkit.toml, image = "bench:1")
  (torchx's Kubernetes scheduler is not measured)

First step: rank 0 writes the wall-clock time its first optimizer step ended into a file
(every node of the local clusters is this machine: one clock). Reported: submit to first step
for each way, the median of the per-pair differences (kit - plain) with p25..p75, and the
time the submitting command itself took; with torchx also torchx - plain and kit - torchx. The
goal (issue 34) is at most 2 s over plain. A pair waits for its jobs to end (SLURM: gone from
squeue, torchx's by the job id in the handle it prints; Kubernetes: finished, then deleted
with its pods) before the next one starts; other users' jobs on the SLURM cluster may still
delay any way's start (the order rotates so a busy spell hits each).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import BenchError, clean_env, pairs_main, write_json
from bench.launch_overhead import bin_of, spread

GOAL_S = 2.0
JOB_TIMEOUT_S = 300
KEYS = (("first_step_s", "to first step"), ("submit_returned_s", "command returned"))
TORCHX_MISSING = "torchx: not installed (pip install -e '.[bench]'); its way skipped"
# What `torchx run` prints on stdout for a SLURM job: slurm://<session>/<job id>
TORCHX_HANDLE = re.compile(r"^slurm://[^/\s]*/(\d+)\s*$", re.MULTILINE)
# squeue's own default (no -t), spelled out: with -j some versions list finished jobs too
ACTIVE_STATES = "PENDING,RUNNING,SUSPENDED,COMPLETING"

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


def project(root: Path, job: str = JOB) -> Path:
    proj = root / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "ddpkit.toml").write_text(job)
    (proj / "marks").mkdir()
    return proj


def sinfo_nodes(state: str) -> str:
    r = subprocess.run(["sinfo", "-h", "-t", state, "-o", "%N"], capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    return r.stdout.strip() if r.returncode == 0 else ""


class Slurm:
    """The local SLURM cluster (`make slurm-up`): plain sbatch against `ddpkit submit slurm`,
    and against torchx's SLURM scheduler when torchx is installed."""

    title = "SLURM, local cluster: ddpkit submit slurm vs sbatch + srun torchrun"
    commands = {
        "plain": "sbatch job.sbatch (srun torchrun --standalone --nproc-per-node 2 train.py)",
        "kit": "ddpkit submit slurm (ddpkit.toml: script = train.py, nproc_per_node = 2)",
        "torchx": "torchx run --scheduler slurm -cfg time=10 dist.ddp -j 1x2 --cpu 2 "
        "--script train.py",
    }
    env: dict[str, str] = {}

    def __init__(self) -> None:
        # torchx is optional (the `bench` extra): without it plain and kit are still measured
        self.skipped = None if importlib.util.find_spec("torchx") else TORCHX_MISSING
        self.ways = ("plain", "kit") if self.skipped else ("plain", "kit", "torchx")

    @contextlib.contextmanager
    def ready(self, root: Path) -> Iterator[Path]:
        cluster_up()
        proj = project(root)
        (proj / "job.sbatch").write_text(
            SBATCH.format(name="{name}", proj=proj, torchrun=bin_of("torchrun"))
        )
        yield proj

    def argv(self, way: str, proj: Path, name: str, mark: Path) -> list[str]:
        if way == "kit":
            return [bin_of("ddpkit"), "submit", "slurm", "--set", f"name={name}", "--", "--mark",
                    str(mark)]  # fmt: skip
        if way == "torchx":  # as a torchx user would, from the project's directory
            # its batch script calls `torchrun` by name: this venv's, as when it is activated
            # (for this way only: the others name their programs and run with the same PATH)
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
            return ["env", f"PATH={path}", bin_of("torchx"), "run", "--scheduler", "slurm",
                    "-cfg", "time=10", "dist.ddp", "-j", "1x2", "--cpu", "2", "--script", "train.py", "--",
                    "--mark", str(mark)]  # fmt: skip
        script = proj / f"{name}.sbatch"
        script.write_text((proj / "job.sbatch").read_text().replace("{name}", name))
        return ["sbatch", "--parsable", str(script), str(mark)]

    def ended(self, name: str, out: str) -> bool:
        """Gone from squeue: by name, or by the job id in torchx's handle (`out`), since torchx
        names the job after its role (train-0) whatever name it is given."""
        handle = TORCHX_HANDLE.search(out)
        query = ["-j", handle[1], "-t", ACTIVE_STATES] if handle else ["-n", name]
        r = subprocess.run(["squeue", "-h", *query, "-o", "%i"], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        gone = (handle and "Invalid job id" in r.stderr) or (  # purged from the controller
            r.returncode == 0 and not r.stdout.strip()
        )
        # ... and its node done cleaning up: a submit while a node still shows COMPLETING waits
        # for the controller's next scheduling pass, ~2.5 s more on this cluster, whichever way
        # it is (seen as a bimodal 4.5 s / 7 s to first step before this wait)
        return bool(gone) and not sinfo_nodes("completing")


class K8s:
    """A private one-node local control plane with the training operator (k8s/local/up.sh):
    `kubectl apply` of a hand-written PyTorchJob against `ddpkit submit k8s`."""

    title = "Kubernetes, local control plane: ddpkit submit k8s vs kubectl apply of a PyTorchJob"
    commands = {
        "plain": "kubectl apply -f job.json (PyTorchJob, Master x1: torchrun --standalone "
        "--nproc-per-node 2 train.py)",
        "kit": "ddpkit submit k8s (ddpkit.toml: image = bench:1, script = train.py)",
    }
    env: dict[str, str] = {}
    ways = ("plain", "kit")
    skipped: str | None = None

    @staticmethod
    def missing() -> str | None:
        from tests.k8s_cluster import binaries_missing

        if shutil.which("kubectl") is None:
            return "kubectl not found (make setup installs it)"
        return binaries_missing()

    @contextlib.contextmanager
    def ready(self, root: Path) -> Iterator[Path]:
        from tests.k8s_cluster import VENV, cluster_env, running_cluster

        why = self.missing()
        if why:
            raise BenchError(f"no Kubernetes control plane: {why}")
        proj = project(root, JOB + 'image = "bench:1"\n')
        env = cluster_env(root / "k8s", f"bench:*={VENV}:{proj}", tag="dkb", net=247, nodes=1)
        try:
            for running in running_cluster(env):
                self.env = {k: running[k] for k in ("KUBECONFIG",)}
                yield proj
        except AssertionError as e:  # up.sh failed: its output's tail
            raise BenchError(f"k8s/local/up.sh failed: {str(e)[-1500:]}") from e

    def argv(self, way: str, proj: Path, name: str, mark: Path) -> list[str]:
        if way == "kit":
            return [bin_of("ddpkit"), "submit", "k8s", "--set", f"name={name}", "--", "--mark",
                    str(mark)]  # fmt: skip
        manifest = proj / f"{name}.json"
        container = {"name": "pytorch", "image": "bench:1", "workingDir": "/workspace",
                     "command": ["torchrun", "--standalone", "--nproc-per-node", "2",
                                 "train.py", "--mark", str(mark)]}  # fmt: skip
        job = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": {
                "replicas": 1, "restartPolicy": "Never",
                "template": {"spec": {"containers": [container]}},
            }}},
        }  # fmt: skip
        manifest.write_text(json.dumps(job))
        return ["kubectl", "apply", "-f", str(manifest)]

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", *args], env=clean_env(**self.env), capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    def ended(self, name: str, out: str) -> bool:
        """Finished (Succeeded or Failed), then deleted with its pods."""
        r = self.kubectl("get", "pytorchjob", name, "-o", "json")
        if r.returncode != 0 and "NotFound" not in r.stderr:
            return False  # the API server did not answer: ask again
        if r.returncode == 0:
            conds = json.loads(r.stdout).get("status", {}).get("conditions", [])
            if not any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
                       for c in conds):  # fmt: skip
                return False
            self.kubectl("delete", "pytorchjob", name, "--wait=false")
        pods = self.kubectl("get", "pods", "-o", "name", "-l",
                            f"training.kubeflow.org/job-name={name}")  # fmt: skip
        return pods.returncode == 0 and not pods.stdout.strip() and r.returncode != 0


ROUTES: dict[str, type[Slurm] | type[K8s]] = {"slurm": Slurm, "k8s": K8s}


def submit_once(route: Slurm | K8s, way: str, proj: Path, name: str) -> dict[str, Any]:
    """Submit one job, wait for its first step and its end: seconds from the submit command's
    start to its return and to the first step. A command that printed a torchx handle has
    submitted even if it then exits non-zero (kept as `exit_after_submit`, reported)."""
    mark = proj / "marks" / name
    argv = route.argv(way, proj, name, mark)
    start = time.time()
    r = subprocess.run(argv, cwd=proj, env=clean_env(**route.env), capture_output=True,
                       text=True, timeout=JOB_TIMEOUT_S)  # fmt: skip
    returned = time.time() - start
    # torchx run asks for the job's status right after sbatch; on this Slurm (22.05) that
    # raises (squeue --json has no job_resources for a pending job) and it exits 1
    after_submit = r.returncode != 0 and TORCHX_HANDLE.search(r.stdout)
    if r.returncode != 0 and not after_submit:
        raise BenchError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    first = mark.with_name(mark.name + ".first")
    deadline = start + JOB_TIMEOUT_S
    while not first.exists() or not first.read_text():
        if time.time() > deadline:
            raise BenchError(f"{way} job {name} wrote no first step in {JOB_TIMEOUT_S} s")
        time.sleep(0.05)
    first_step = float(first.read_text()) - start
    while not route.ended(name, r.stdout):  # the next submit starts on a cluster it has left
        if time.time() > deadline:
            raise BenchError(f"{way} job {name} did not end in {JOB_TIMEOUT_S} s")
        time.sleep(0.5)
    times: dict[str, Any] = {"submit_returned_s": returned, "first_step_s": first_step}
    if after_submit:
        last = r.stderr.strip().rpartition("\n")[2]
        times["exit_after_submit"] = f"{r.returncode}, {last}"
    return times


def measure(pairs: int, backend: str = "slurm") -> dict[str, Any]:
    route = ROUTES[backend]()
    runs: list[dict[str, Any]] = []
    tag = f"{os.getpid()}"
    # /tmp is the cluster's shared filesystem here (every node, every pod, is this machine)
    ways = route.ways
    with (
        tempfile.TemporaryDirectory(prefix="ddpkit-bench-submit-") as tmp,
        route.ready(Path(tmp)) as proj,
    ):
        submit_once(route, "plain", proj, f"bsub-warm-{tag}")  # page cache, the first start
        for i in range(pairs):
            order = ways[i % len(ways) :] + ways[: i % len(ways)]
            runs.append(
                {way: submit_once(route, way, proj, f"bsub-{way}-{tag}-{i}") for way in order}
            )

    def over(a: str, b: str) -> dict[str, dict[str, float]]:
        return {k: spread([p[a][k] - p[b][k] for p in runs]) for k, _ in KEYS}

    result: dict[str, Any] = {
        "backend": backend,
        "pairs": runs,
        "commands": {way: route.commands[way] for way in ways},
        "skipped": route.skipped,
        "over_plain": over("kit", "plain"),
        **{way: {k: spread([p[way][k] for p in runs]) for k, _ in KEYS} for way in ways},
    }
    if "torchx" in ways:
        result |= {
            "torchx_over_plain": over("torchx", "plain"),
            "kit_over_torchx": over("kit", "torchx"),
        }
    return result


def diff_text(d: dict[str, float]) -> str:
    return f"{d['median']:+.2f} (p25..p75 {d['p25']:+.2f}..{d['p75']:+.2f})"


def lines(result: dict[str, Any]) -> list[str]:
    n, over = len(result["pairs"]), result["over_plain"]
    out = [f"submit ({ROUTES[result.get('backend', 'slurm')].title}), {n} pairs"]
    for key, what in KEYS:
        o, p, k = over[key], result["plain"][key], result["kit"][key]
        goal = ""
        if key == "first_step_s":
            goal = f"; goal <= {GOAL_S} s over: {'met' if o['median'] <= GOAL_S else 'NOT met'}"
        out.append(
            f"  {what:16} plain {p['median']:.2f} s, kit {k['median']:.2f} s; kit - plain"
            f" {diff_text(o)}{goal}"
        )
    if "torchx" in result:
        for key, what in KEYS:
            out.append(
                f"  {what:16} torchx {result['torchx'][key]['median']:.2f} s; torchx - plain"
                f" {diff_text(result['torchx_over_plain'][key])}, kit - torchx"
                f" {diff_text(result['kit_over_torchx'][key])}"
            )
        errors = [p["torchx"]["exit_after_submit"] for p in result["pairs"]
                  if "exit_after_submit" in p.get("torchx", {})]  # fmt: skip
        if errors:
            out.append(
                f"  torchx run exited non-zero after printing its job's handle in {len(errors)}"
                f" of {n} (the job ran and is measured): {errors[-1]}"
            )
    elif result.get("skipped"):
        out.append(f"  {result['skipped']}")
    return out


def run(pairs: int, out: Path, env: dict[str, Any], backend: str = "slurm") -> list[str]:
    result = measure(pairs, backend)
    name = "submit.json" if backend == "slurm" else f"submit-{backend}.json"
    write_json(out / name, {"env": env, **result})
    return lines(result)


def main(argv: list[str] | None = None) -> int:
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--backend", choices=tuple(ROUTES), default="slurm")
    known, rest = pick.parse_known_args(argv)
    return pairs_main(
        rest,
        "python -m bench.submit_latency [--backend slurm|k8s]",
        __doc__,
        3,
        lambda pairs, out, env: run(pairs, out, env, known.backend),
    )


if __name__ == "__main__":
    sys.exit(main())
