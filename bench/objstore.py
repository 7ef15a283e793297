"""Checkpoints in an object store against the store's own speed, in one run (`python -m
bench --only s3`, or `python -m bench.objstore`): a real S3-compatible server on loopback
(tests/s3_fixtures.start: versitygw over a tmp dir), one process, a model with AdamW state.

Per repetition (the first one warms up and is not reported):
- save:    Checkpointer.save(force_sync) to s3://.../sync (stage, hash, upload, marker last),
           against a raw put: s3fs `put` of files of the same names and sizes (random bytes
           already on local disk) under another prefix. Ratio: raw-put time / save time, i.e.
           the save's upload throughput over the raw put's (goal >= 0.8);
- blocked: the seconds an async save to the store blocks the loop (Checkpointer.save's return
           plus the staging fence), against the sync save's time (goal <= 0.05);
- load:    Checkpointer.resume("auto") from the store (list, read, verify, load), against a
           raw get of the same objects. Ratio: raw-get time / load time (goal >= 0.8).
Speed is reported, never asserted. Medians of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, write_json

GOALS = {"save_vs_put": (">=", 0.8), "blocked_vs_sync": ("<=", 0.05), "load_vs_get": (">=", 0.8)}


def _model(name: str, batch: int):
    import torch
    import torch.nn.functional as F
    from ddpkit.train import distributed
    from ddpkit.train.ckpt import ModelState, OptimizerState
    from ddpkit.train.config import TrainConfig, validate
    from ddpkit.train.models import build_model
    from ddpkit.train.parallel import parallelize

    cfg = TrainConfig(model=name, run_dir=tempfile.mkdtemp(prefix="ddpkit-bench-"))
    validate(cfg)
    world = distributed.init(cfg)
    torch.manual_seed(0)
    model, raw = parallelize(build_model(cfg, (1, 28, 28), 10), cfg, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # the optimizer state exists from here
    return {"model": ModelState(raw), "optim": OptimizerState(raw, opt)}, step


def measure(url: str, fs: Any, work: Path, model: str, reps: int) -> dict[str, Any]:
    from ddpkit.train.ckpt import Checkpointer

    states, step = _model(model, 32)
    quiet = lambda msg: None  # noqa: E731
    sync = Checkpointer(f"{url}/sync", 1, False, quiet)
    asyn = Checkpointer(f"{url}/async", 1, True, quiet)
    info = {"model": model, "world_size": 1}
    root = url.removeprefix("s3://")
    rows: list[dict[str, float]] = []
    for rep in range(reps + 1):
        save_s = sync.save(rep, states, info, force_sync=True)
        sync._join_pruner()
        files = {
            k.rsplit("/", 1)[1]: fs.size(k) for k in fs.find(f"{root}/sync/step-{rep}")
        }  # what the save put, marker included
        raw = work / f"raw-{rep}"
        raw.mkdir()
        for name, size in files.items():
            (raw / name).write_bytes(os.urandom(size))
        names = sorted(files)
        t0 = time.perf_counter()
        fs.put([str(raw / n) for n in names], [f"{root}/raw/{rep}/{n}" for n in names])
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        asyn.save(rep, states, info)
        asyn.wait_staging()  # the trainer fences staging before the optimizer step
        blocked = time.perf_counter() - t0
        while not asyn._pending[0].done():
            step()  # training goes on while the upload runs
        asyn.wait()
        t0 = time.perf_counter()
        got = sync.resume("auto", states)
        load_s = time.perf_counter() - t0
        assert got is not None and got[0].endswith(f"step-{rep}")
        back = work / f"get-{rep}"
        t0 = time.perf_counter()
        fs.get([f"{root}/raw/{rep}/{n}" for n in names], [str(back / n) for n in names])
        get_s = time.perf_counter() - t0
        if rep:
            rows.append(
                {
                    "bytes": sum(files.values()),
                    "save_s": save_s,
                    "put_s": put_s,
                    "blocked_s": blocked,
                    "load_s": load_s,
                    "get_s": get_s,
                }
            )
    asyn.close()
    sync.close()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {
        "model": model,
        "reps": reps,
        "rows": rows,
        "save_vs_put": med([r["put_s"] / r["save_s"] for r in rows]),
        "blocked_vs_sync": med([r["blocked_s"] / r["save_s"] for r in rows]),
        "load_vs_get": med([r["get_s"] / r["load_s"] for r in rows]),
    }


def run(model: str, reps: int, out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.s3_fixtures import start, stop

    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-s3-") as tmp:
        server, proc = start(Path(tmp) / "server")
        try:
            os.environ.update(
                {k: v for k, v in server.env().items() if k.startswith("AWS_")}
                | {"DDPKIT_CKPT_STAGE": str(Path(tmp) / "stage")}
            )
            url = server.bucket("bench")
            work = Path(tmp) / "work"
            work.mkdir()
            res = measure(url, server.fs(), work, model, reps)
        finally:
            stop(proc)
    write_json(out, res)
    return res


def report(res: dict[str, Any]) -> list[str]:
    mb = statistics.median(r["bytes"] for r in res["rows"]) / 2**20
    lines = [f"s3 checkpoints ({res['model']}, {mb:.1f} MiB, {res['reps']} reps, medians):"]
    for key, (op, goal) in GOALS.items():
        v = res[key]
        met = v >= goal if op == ">=" else v <= goal
        lines.append(f"  {key:<16} {v:6.3f}  (goal {op} {goal}: {'met' if met else 'NOT met'})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.objstore", description=__doc__)
    ap.add_argument("--model", default="mlp-deep")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench" / "objstore.json"))
    args = ap.parse_args(argv)
    res = run(args.model, args.reps, Path(args.out))
    print("\n".join(report(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
