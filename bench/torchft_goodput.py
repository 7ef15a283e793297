"""One failure with and without torchft (issue 35: what per-step fault tolerance buys).

    .venv/bin/python -m bench.torchft_goodput [--steps 400 --kill-at 150 --out ...]

The same job, 2 data ranks on this machine (a user's model whose forward takes 50 ms, a
stand-in for real compute: the built-in mlp's 15 ms steps are below this machine's noise),
a save every 100 steps, run through `ddpkit run` from a scratch project four times:

    plain    one torchrun with 2 ranks (DDP); clean, then with rank 1 SIGKILLed at step K:
             torchrun restarts both ranks in place, they resume from the last save
    torchft  fault_tolerance = "torchft", 2 replica groups x 1 rank; clean, then with group
             1's rank SIGKILLed at step K: its torchrun restarts it while group 0 trains on,
             and it heals from group 0

The kill goes through the drill's own machinery (ddpkit.tools.chaos). Every output line is
timed as it arrives. Reported per mode: the survivor's stall (the kill to the first step past
the last one logged before it: for plain, detection + restart + load + the steps redone; for
torchft, group 0's wait for the quorum without group 1), the survivor's longest gap between
logged steps after the kill, the steps redone, the killed rank's return (plain: its first
step after the restart; torchft: group 1's "healed" line), and the wall time against the
clean run of the same mode (one pair each: a noisy figure on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import clean_env, table, write_json

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
QUORUM_TIMEOUT_S = 20  # torchft's TORCHFT_QUORUM_TIMEOUT_SEC for the run (as the tests use)

# (tests/process/launch/test_torchft.py runs the same model: a steady step on any machine)
NET_PY = """\
import time
import torch

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 2))

    def forward(self, x):
        time.sleep(0.05)
        return self.net(x)

def build(cfg):
    return Slow()

def data(cfg):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = (x.sum(1) > 0).long()
    pairs = list(zip(x, y))
    return pairs[:448], pairs[448:]
"""
JOB = """\
name = "ftg"
accelerator = "cpu"
{mode}
[env]
TORCHFT_QUORUM_TIMEOUT_SEC = "{quorum}"
[train]
model = "mymodels.net:build"
dataset = "mymodels.net:data"
batch_size = 8
steps = {steps}
log_interval = 1
ckpt_interval = 100
eval = false
"""
MODES = {
    "plain": "nproc_per_node = 2",
    "torchft": 'nproc_per_node = 1\nfault_tolerance = "torchft"\nreplica_groups = 2',
}
STEP = re.compile(r"^(?:\[group (\d+)\] )?step\s+(\d+)/")


def _project(root: Path, mode: str, steps: int) -> Path:
    (root / "mymodels").mkdir(parents=True)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "net.py").write_text(NET_PY)
    job = JOB.format(mode=MODES[mode], quorum=QUORUM_TIMEOUT_S, steps=steps)
    (root / "ddpkit.toml").write_text(job)
    return root


def launch(root: Path, mode: str, steps: int, kill_at: int | None) -> dict[str, Any]:
    """One run; with kill_at, the data rank of the second group (plain: rank 1) SIGKILLed
    once step kill_at is logged. Returns the timed lines and the kill's time."""
    from ddpkit.tools import chaos

    proj = _project(root, mode, steps)
    env = clean_env()
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [DDPKIT, "run"], cwd=proj, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    killed_at = None
    try:
        if kill_at is not None:
            target = proj / "runs/ftg" / ("group-1" if mode == "torchft" else "")
            rank = 0 if mode == "torchft" else 1
            inj = chaos.Injection.parse(f"kill-rank@step={kill_at}:rank={rank}", random.Random(0))
            said: list[str] = []

            def say(msg: str) -> None:
                nonlocal killed_at
                killed_at = killed_at or time.monotonic()
                said.append(msg)

            chaos.drill(target.resolve(), [inj], alive=lambda: proc.poll() is None, say=say)
            if not any("SIGKILL" in s for s in said):
                raise SystemExit(f"{mode}: the kill did not fire: {said}")
        rc = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    if rc != 0:
        text = "\n".join(line for _, line in lines)
        raise SystemExit(f"{mode} failed ({rc}):\n{text[-3000:]}")
    return {"wall_s": time.monotonic() - t0, "t0": t0, "killed_at": killed_at, "lines": lines}


def steps_of(run: dict[str, Any], group: str | None) -> list[tuple[float, int]]:
    """(time, step) of each step line of one group (plain: the job's)."""
    out = []
    for t, line in run["lines"]:
        m = STEP.match(line)
        if m and m.group(1) == group:
            out.append((t, int(m.group(2))))
    return out


def figures(mode: str, run: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """The failure's cost, from the timed lines (see the module's docstring)."""
    survivor = steps_of(run, "0" if mode == "torchft" else None)
    k = run["killed_at"]
    before = [s for t, s in survivor if t <= k]
    last = max(before) if before else 0
    after = [(t, s) for t, s in survivor if t > k]
    past = next((t for t, s in after if s > last), None)
    times = [k] + [t for t, _ in after]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    redone = 0
    if mode == "plain":
        resumed = [int(m.group(1)) for _, line in run["lines"]
                   if (m := re.search(r"resumed from .* at step (\d+)", line))]  # fmt: skip
        redone = last - resumed[-1] if resumed else last
        back = next((t for t, _ in after), None)  # the restarted ranks' first step
    else:
        back = next(
            (t for t, line in run["lines"] if t > k and "replica group 1 healed" in line), None
        )
    return {
        "kill_step": last,
        "stall_s": None if past is None else past - k,
        "longest_gap_s": max(gaps) if gaps else None,
        "steps_redone": redone,
        "return_s": None if back is None else back - k,
        "wall_s": run["wall_s"],
        "clean_wall_s": clean["wall_s"],
        "lost_s": run["wall_s"] - clean["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.torchft_goodput")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--kill-at", type=int, default=150)
    p.add_argument("--out", default="out/bench/torchft_goodput.json")
    args = p.parse_args(argv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-ftg-") as tmp:
        for mode in ("plain", "torchft"):
            print(f"{mode}: clean run, then one with a rank SIGKILLed at step {args.kill_at}",
                  flush=True)  # fmt: skip
            clean = launch(Path(tmp) / f"{mode}-clean", mode, args.steps, None)
            failed = launch(Path(tmp) / f"{mode}-kill", mode, args.steps, args.kill_at)
            result[mode] = figures(mode, failed, clean)

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [["mode", "killed at", "survivor stall s", "longest gap s", "steps redone",
             "killed rank back s", "wall s (clean)", "lost s"]]  # fmt: skip
    for mode, f in result.items():
        rows.append([mode, str(f["kill_step"]), s(f["stall_s"]), s(f["longest_gap_s"]),
                     str(f["steps_redone"]), s(f["return_s"]),
                     f"{f['wall_s']:.0f} ({f['clean_wall_s']:.0f})", s(f["lost_s"])])  # fmt: skip
    write_json(
        Path(args.out),
        {"command": [sys.executable, "-m", "bench.torchft_goodput", *(argv or sys.argv[1:])],
         "load_average": os.getloadavg(), "quorum_timeout_s": QUORUM_TIMEOUT_S, **result},
    )  # fmt: skip
    print(f"\none failure, {args.steps} steps, 2 data ranks, a save every 100 steps "
          f"(TORCHFT_QUORUM_TIMEOUT_SEC={QUORUM_TIMEOUT_S})\n{table(rows)}\nJSON in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
