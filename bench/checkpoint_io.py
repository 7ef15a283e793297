"""Checkpoint save time, sync vs async, against the raw write speed of the same disk.

Two parts, both on 2 gloo ranks:

1. `torchrun ... -m bench.checkpoint_io --worker ...` drives ddpkit.train.ckpt.Checkpointer (the
   kit's DCP manager) directly on a model with AdamW state, and per repetition, in a rotated
   order, measures:
   - sync:    Checkpointer.save(force_sync) wall time on rank 0 (rank 0 finishes last: it
              writes DCP's .metadata and the .complete marker), CRC-32s taken while writing;
   - dcp:     plain dcp.save with torch's FileSystemWriter of the same state (no checksums,
              no marker, no pruning): what the kit's manager and its checksums add;
   - async:   the seconds Checkpointer.save returns (the loop is blocked: state-dict build,
              copy to staging memory), then training steps continue until every rank's write
              is done (ranks agree per step with a MIN all_reduce, as training would need),
              and the time until the last rank's write finished (a done-callback);
   - raw x1:  rank 0 writes the same number of bytes to one file, 8 MiB chunks, fsync;
   - raw x2:  both ranks write half of it each at once (DCP writes from every rank).
   DCP's FileSystemWriter fsyncs each file too, so all of them reach the disk. Per
   repetition, sync MB/s over each of the others' MB/s (paired: the same minute of the disk).
2. Time to first step of `python -m ddpkit.train` started fresh vs resumed from a checkpoint of
   the same model (bench.kit_timed launches, alternated F R F R ...).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CHUNK = 8 << 20


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def raw_write(path: Path, nbytes: int) -> float:
    """Seconds to write nbytes sequentially and fsync (the file is removed afterwards)."""
    buf = os.urandom(CHUNK)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            f.write(buf[:n] if n < CHUNK else buf)
            left -= n
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - t0
    path.unlink()
    return took


# --- the torchrun worker -------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ddpkit.train import distributed
    from ddpkit.train.ckpt import Checkpointer, ModelState, OptimizerState
    from ddpkit.train.config import TrainConfig, validate
    from ddpkit.train.distributed import set_threads_from_env
    from ddpkit.train.metrics import state_bytes
    from ddpkit.train.models import build_model
    from ddpkit.train.parallel import parallelize

    from bench.common import write_json

    set_threads_from_env()
    root = Path(args.dir)
    cfg = TrainConfig(model=args.model, parallel=args.parallel, run_dir=str(root))
    validate(cfg)
    world = distributed.init(cfg)
    rank = world.rank
    torch.manual_seed(0)
    model, raw = parallelize(build_model(cfg, (1, 28, 28), 10), cfg, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch_size, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch_size,))

    def step(fence=None) -> tuple[float, float]:
        """One training step; `fence` runs where the trainer calls wait_staging (after the
        forward/backward, before the optimizer step). Returns (step s, fence s)."""
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        if fence is not None:
            fence()
        t2 = time.perf_counter()
        opt.step()
        return time.perf_counter() - t0, t2 - t1

    step()  # AdamW state exists from here: the checkpoint holds params + exp_avg + exp_avg_sq
    base_steps = [step()[0] for _ in range(args.base_steps)]
    quiet = lambda msg: None  # noqa: E731
    ck = {
        "sync": Checkpointer(str(root / "sync"), 1, False, quiet),
        "async": Checkpointer(str(root / "async"), 1, True, quiet),
    }
    sb = state_bytes(model, opt)
    info = {"model": args.model, "world_size": world.size}
    states = {"model": ModelState(raw), "optim": OptimizerState(raw, opt)}
    breakdown = blocked_breakdown(states)
    order = ["sync", "dcp", "async", "raw1", "raw2"]
    res: dict[str, list[Any]] = {k: [] for k in order}
    nbytes = 0
    for rep in range(args.reps + 1):  # rep 0 warms up (first-save allocations), not reported
        k = rep % len(order)
        for kind in order[k:] + order[:k]:
            dist.barrier()
            if kind == "sync":
                t = ck["sync"].save(rep, states, info, force_sync=True)
                # keep-K deletes the previous checkpoint in a background thread: let it finish
                # here, outside every timing, or the next variant's write shares the disk with it
                ck["sync"]._join_pruner()
                if rank == 0:
                    nbytes = dir_bytes(root / "sync" / f"step-{rep}")
                rec: dict[str, Any] = {"save_s": t}
            elif kind == "dcp":
                rec = {"save_s": plain_dcp_save(root / "dcp", states)}
            elif kind == "async":
                rec = async_save(ck["async"], rep, states, info, step)
            else:
                n = torch.tensor([nbytes], dtype=torch.int64)
                dist.broadcast(n, 0)  # the size of the sync checkpoint (sync runs first in rep 0)
                size = int(n) or sb["params"] + sb["optim"]
                writers = 1 if kind == "raw1" else world.size
                t = 0.0
                if rank < writers:
                    t = raw_write(root / f"raw-{rank}.bin", size // writers)
                tt = torch.tensor([t], dtype=torch.float64)
                dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # done when the slowest writer is
                rec = {"save_s": float(tt), "bytes": size}
            if rep > 0:
                res[kind].append(rec)
    ck["async"].close()  # waits for the last save and frees the stager's buffers
    readback = checksum_cost(root / "sync" / f"step-{args.reps}") if rank == 0 else None
    if rank == 0:
        write_json(
            Path(args.out),
            {
                "model": args.model,
                "parallel": args.parallel,
                "world_size": world.size,
                "state_bytes_rank0": sb,
                "checkpoint_bytes": nbytes,
                "base_step_s": statistics.median(base_steps) if base_steps else None,
                "blocked_breakdown_s": breakdown,
                # a CRC-32 pass over the checkpoint read back from disk: what every save
                # cost on rank 0 before the checksums were taken while writing, and what
                # `ddpkit.tools.ckpt inspect` still does
                "readback_checksum": readback,
                "results": res,
            },
        )
    distributed.shutdown()
    return 0


def plain_dcp_save(path: Path, states) -> float:
    """Seconds for dcp.save of the same parts with torch's own writer (the files go after)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    state = {name: sd for name, part in states.items() if (sd := part.state_dict())}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    took = time.perf_counter() - t0
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(path)
    return took


def async_save(ck, rep, states, info, step) -> dict[str, Any]:
    """An async save while training goes on, as the trainer does it: the save, then the next
    step's forward/backward, then wait_staging() before its optimizer step. The loop is
    blocked for what save() takes plus what that first wait_staging() waits."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    returned = ck.save(rep, states, info)
    written: list[float] = []
    ck._pending[0].add_done_callback(lambda _: written.append(time.perf_counter()))
    first, staging_wait = step(ck.wait_staging)
    steps = [first]
    while True:
        # Every rank must run the same number of training steps: agree on "all done".
        done = torch.tensor([int(ck._pending[0].done())])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if int(done):
            break
        steps.append(step(ck.wait_staging)[0])
    ck.wait()
    t = torch.tensor([written[0] - t0 if written else time.perf_counter() - t0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # complete when the last rank's write is
    # the slowest rank's: the next collective waits for it
    blocked = torch.tensor([returned + staging_wait, returned, staging_wait], dtype=torch.float64)
    dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
    return {
        "blocked_s": float(blocked[0]),
        "returned_s": float(blocked[1]),  # each of the three the max over ranks
        "staging_wait_s": float(blocked[2]),
        "complete_s": float(t),
        "steps_during": len(steps),
        "step_s_during": statistics.median(steps),
    }


def _drop_cache(path: Path) -> bool:
    """Ask the kernel to forget a file's cached pages (True when it could)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def checksum_cost(step_dir: Path, reps: int = 3) -> dict[str, Any]:
    """What a read-back checksum pass costs: CRC-32 of every file of a checkpoint (what rank
    0 did after every save and before every load before the checksums were taken while
    writing; tools/ckpt.py inspect still does it) against a plain read of the same bytes,
    with the files in the page cache and dropped from it."""
    from ddpkit.train.ckpt.files import checksum_files

    files = [p for p in sorted(step_dir.iterdir()) if p.is_file()]
    nbytes = sum(p.stat().st_size for p in files)

    def plain_read() -> None:
        for p in files:
            with open(p, "rb") as f:
                while f.read(CHUNK):
                    pass

    out: dict[str, Any] = {"bytes": nbytes}
    for cache in ("warm", "cold"):
        for kind, fn in (("read", plain_read), ("crc32", lambda: checksum_files(step_dir))):
            ts = []
            for _ in range(reps):
                if cache == "cold" and not all(_drop_cache(p) for p in files):
                    break
                plain_read() if cache == "warm" and not ts else None  # warm the cache
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            out[f"{kind}_{cache}_s"] = statistics.median(ts) if ts else None
    w = out["read_warm_s"]
    out["crc32_over_read_warm"] = out["crc32_warm_s"] / w if w else None
    c = out["read_cold_s"]
    out["crc32_over_read_cold"] = out["crc32_cold_s"] / c if c else None
    return out


def blocked_breakdown(states) -> dict[str, float]:
    """Where an async save's blocked time goes: get_state_dict, then the staging copy into
    new buffers (a first save, or a stager made per save) or into reused ones (a stager kept
    across saves, as ddpkit.train.ckpt does since f408bf2)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    t0 = time.perf_counter()
    state = {name: part.state_dict() for name, part in states.items()}
    t1 = time.perf_counter()
    fresh = DefaultStager(StagingOptions(False, False, False, False))
    fresh.stage(state)
    t2 = time.perf_counter()
    fresh.close()
    keep = DefaultStager(StagingOptions(False, False, False, False))
    keep.stage(state)
    t3 = time.perf_counter()
    keep.stage(state)
    t4 = time.perf_counter()
    keep.close()
    return {"get_state_dict": t1 - t0, "stage_new_buffers": t2 - t1, "stage_reused": t4 - t3}


# --- the driver (runs in the bench process) ------------------------------------------------


def run_saves(model: str, reps: int, batch_size: int, work: Path, log) -> dict[str, Any]:
    from bench.common import launch, read_json, torchrun_cmd

    out = work / "ckpt-worker.json"
    scratch = work / "ckpt-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    cmd = torchrun_cmd(
        2,
        "bench.checkpoint_io",
        "--worker",
        "--out",
        str(out),
        "--dir",
        str(scratch),
        "--model",
        model,
        "--reps",
        str(reps),
        "--batch-size",
        str(batch_size),
    )
    try:
        _, wall, _ = launch(cmd, timeout_s=600)
        rec = read_json(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        out.unlink(missing_ok=True)
    rec["command"] = shlex.join(cmd)
    rec["launch_wall_s"] = wall
    rec["summary"] = summarize_saves(rec)
    s = rec["summary"]
    c = rec.get("readback_checksum") or {}
    if c:
        log(
            f"  {model}: a read-back crc32 pass (no longer part of a save) would take "
            f"{c['crc32_warm_s']:.3f} s in cache, {c['crc32_cold_s'] or 0:.3f} s from disk"
        )
    log(
        f"  {model}: {s['checkpoint_mb']:.0f} MB; sync {s['sync_s']['median']:.2f} s (plain "
        f"dcp {s['dcp']['s']['median']:.2f} s), async blocked "
        f"{s['async']['blocked_s']['median']:.3f} s (complete "
        f"{s['async']['complete_s']['median']:.2f} s), raw {s['raw1']['s']['median']:.2f} s; "
        f"sync / raw x1 {s['raw1']['sync_over']['median']:.2f}, / raw x2 "
        f"{s['raw2']['sync_over']['median']:.2f} (MB/s, paired)"
    )
    return rec


def summarize_saves(rec: dict[str, Any]) -> dict[str, Any]:
    from bench.common import spread

    r, mb = rec["results"], rec["checkpoint_bytes"] / 1e6
    sync = [x["save_s"] for x in r["sync"]]
    out: dict[str, Any] = {
        "checkpoint_mb": mb,
        "base_step_s": rec.get("base_step_s"),
        "blocked_breakdown_s": rec.get("blocked_breakdown_s"),
        "sync_s": spread(sync),
        "sync_mb_s": spread([mb / t for t in sync]),
    }
    for kind in ("async",):
        xs = r[kind]
        blocked = [x["blocked_s"] for x in xs]
        complete = [x["complete_s"] for x in xs]
        out[kind] = {
            "blocked_s": spread(blocked),
            # its two parts: save() returning, the loop's wait in wait_staging()
            "returned_s": spread([x.get("returned_s", x["blocked_s"]) for x in xs]),
            "staging_wait_s": spread([x.get("staging_wait_s", 0.0) for x in xs]),
            # paired within a repetition: the async save next to the sync one
            "blocked_over_sync": spread([b / s for b, s in zip(blocked, sync, strict=False)]),
            "complete_s": spread(complete),
            "mb_s": spread([mb / t for t in complete]),
            "steps_during": spread([x["steps_during"] for x in xs]),
            "step_s_during": spread([x["step_s_during"] for x in xs if x["step_s_during"]]),
        }
    for kind in ("dcp", "raw1", "raw2"):
        ts = [x["save_s"] for x in r.get(kind, [])]
        out[kind] = {
            "s": spread(ts),
            "mb_s": spread([mb / t for t in ts]),
            # sync MB/s over this one's, paired within a repetition
            "sync_over": spread([t / s for t, s in zip(ts, sync, strict=False)]),
        }
    return out


def save_rows(rec: dict[str, Any]) -> list[list[str]]:
    from bench.common import fmt_spread

    s = rec["summary"]
    rows = [
        [
            "sync (kit, crc32 while writing)",
            fmt_spread(s["sync_s"], 1, 3),
            fmt_spread(s["sync_mb_s"], 1, 0),
            "-",
            "1",
        ]
    ]
    a = s["async"]
    rows.append(
        ["async (kit): complete", fmt_spread(a["complete_s"], 1, 3), fmt_spread(a["mb_s"], 1, 0)]
        + ["-", "-"]
    )
    rows.append(
        ["async (kit): loop blocked", fmt_spread(a["blocked_s"], 1, 3), "-"]
        + [fmt_spread(a["blocked_over_sync"], 1, 2), "-"]
    )
    rows.append(["  of which save() returning", fmt_spread(a["returned_s"], 1, 4), "-", "-", "-"])
    rows.append(["  of which wait_staging()", fmt_spread(a["staging_wait_s"], 1, 4), "-", "-", "-"])
    for kind, label in (
        ("dcp", "plain dcp.save, no checksums"),
        ("raw1", "raw write+fsync, 1 writer"),
        ("raw2", "raw write+fsync, 2 writers"),
    ):
        k = s[kind]
        rows.append(
            [label, fmt_spread(k["s"], 1, 3), fmt_spread(k["mb_s"], 1, 0), "-"]
            + [fmt_spread(k["sync_over"], 1, 2)]
        )
    return rows


SAVE_HEADER = ["checkpoint save", "seconds", "MB/s", "blocked / sync", "sync MB/s / this"]


def resume_command(
    model: str, out: Path, run_dir: Path, ckpt_dir: Path, resume: str, steps: int, final: bool
) -> list[str]:
    from bench.common import torchrun_cmd

    return torchrun_cmd(
        2,
        "bench.kit_timed",
        "--out",
        str(out),
        "--",
        "--model",
        model,
        "--steps",
        str(steps),
        "--run-dir",
        str(run_dir),
        "--ckpt-dir",
        str(ckpt_dir),
        "--resume",
        resume,
        "--ckpt-final" if final else "--no-ckpt-final",
        "--no-eval",
        "--log-interval",
        "1000",
        "--progress",
        "plain",
    )


def run_resume(model: str, pairs: int, work: Path, log) -> dict[str, Any]:
    """F R F R ...: the first fresh run also writes the checkpoint the resumed runs load."""
    from bench.common import launch, read_json, spread

    base = work / "resume"
    shutil.rmtree(base, ignore_errors=True)
    ckpt = base / "ckpt"
    runs: list[dict[str, Any]] = []
    try:
        for i in range(2 * pairs):
            fresh = i % 2 == 0
            run_dir, out = base / f"run-{i}", base / f"run-{i}.json"
            if fresh:
                first = i == 0
                cmd = resume_command(
                    model, out, run_dir, ckpt if first else base / "unused", "never", 2, first
                )
            else:
                cmd = resume_command(
                    model, out, run_dir, base / "unused", str(ckpt / "step-2"), 3, False
                )
            t_launch, wall, _ = launch(cmd, timeout_s=300)
            rec = read_json(out)
            summary = read_json(run_dir / "summary.json")
            phases = {p["phase"]: round(p["s"], 4) for p in rec["phases"]}
            r = {
                "kind": "fresh" if fresh else "resume",
                "command": shlex.join(cmd),
                "launch_to_first_step_s": rec["t_first_step"] - t_launch,
                "process_to_first_step_s": rec["t_first_step"] - rec["t_import"],
                "kit_time_to_first_step_s": summary["time_to_first_step_s"],
                "resume_load_s": phases.get("resume (find + load)"),
                "resumed_from": summary.get("resumed_from"),
                "launch_wall_s": wall,
                "phases": phases,
            }
            log(
                f"  {model} {r['kind']:<6} first step {r['launch_to_first_step_s']:.2f} s after "
                f"launch (kit: {r['kit_time_to_first_step_s']:.2f} s, load "
                f"{r['resume_load_s'] or 0:.2f} s)"
            )
            runs.append(r)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summ: dict[str, Any] = {}
    for kind in ("fresh", "resume"):
        rs = [r for r in runs if r["kind"] == kind]
        for key in ("launch_to_first_step_s", "kit_time_to_first_step_s", "resume_load_s"):
            summ.setdefault(kind, {})[key] = spread([r[key] for r in rs if r[key] is not None])
    fr = [r["kit_time_to_first_step_s"] for r in runs if r["kind"] == "fresh"]
    re_ = [r["kit_time_to_first_step_s"] for r in runs if r["kind"] == "resume"]
    summ["resume_minus_fresh_kit_s"] = spread([b - a for a, b in zip(fr, re_, strict=False)])
    return {"model": model, "pairs": pairs, "runs": runs, "summary": summ}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.checkpoint_io")
    p.add_argument("--worker", action="store_true", help="run as a torchrun worker")
    p.add_argument("--out", required=True)
    p.add_argument("--dir", required=True, help="scratch directory for the checkpoints")
    p.add_argument("--model", default="mlp-deep")
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--base-steps", type=int, default=3)
    args = p.parse_args(argv)
    if not args.worker:
        p.error("run through `python -m bench` (this module's CLI is the torchrun worker)")
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
