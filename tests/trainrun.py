"""Run `python -m ddpkit.train` for real: one process, or torchrun with gloo ranks."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
ALL_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "DDPKIT_FAULT",
        )
    }
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def memory_here(capsys, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`ddpkit memory ARGS` in this process, from `cwd` (the repository root by default),
    output captured as run_module captures it. A subprocess imports torch again (~4 s of CPU
    per call on these cores, most of a planner test's time); the planner's own process (exit
    status, one-line errors through the installed command) keeps its tests that run it so."""
    from ddpkit.tools.planner.cli import main

    capsys.readouterr()
    with contextlib.chdir(cwd):
        rc = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["ddpkit", "memory", *args], rc, out, err)


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` from the repository root, output captured."""
    return subprocess.run(
        [PY, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@dataclass
class Run:
    rc: int
    out: str
    run_dir: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def metrics(self) -> list[dict]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if x.strip()]


def torchrun_cmd(nproc: int, *extra: str) -> list[str]:
    return [
        TORCHRUN,
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--signals-to-handle",
        ALL_SIGNALS,
        *extra,
        "-m",
        "ddpkit.train",
    ]


def train(
    run_dir: Path,
    *args: str,
    nproc: int = 0,
    torchrun_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> Run:
    """nproc=0: a plain `python -m ddpkit.train` process (world size 1, no torchrun)."""
    cmd = torchrun_cmd(nproc, *torchrun_args) if nproc else [PY, "-m", "ddpkit.train"]
    cmd += ["--run-dir", str(run_dir), "--progress", "plain", *args]
    p = subprocess.run(
        cmd, cwd=ROOT, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=timeout
    )
    run = Run(p.returncode, p.stdout + p.stderr, run_dir)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{run.out[-4000:]}")
    return run


def full_params(ckpt: Path, part: str = "model") -> dict:
    """Full tensors of a DCP checkpoint's part, loaded the way `ddpkit.tools.ckpt export` does."""
    sys.path.insert(0, str(ROOT))
    from ddpkit.tools.ckpt import load_full_model

    return load_full_model(ckpt, part)


def last_checkpoint(run_dir: Path) -> Path:
    steps = sorted((run_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    assert steps, f"no checkpoint under {run_dir}"
    return steps[-1]


def as_a_process(capfd: Any, call: Callable[[], int]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `call()` run in this process as a new process would
    show them: Python's default warning filters, and each warning on stderr as a line of its
    own (a warning beside a one-line error is a second line). Saves a torch import per case."""
    import warnings

    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                       ResourceWarning):  # fmt: skip
            warnings.simplefilter("ignore", hidden)
        rc = call()
    out, err = capfd.readouterr()
    return rc, out, err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
