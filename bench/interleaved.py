"""The kit's loop and the plain loop in the same two processes, in alternating blocks.

    torchrun --nproc-per-node 2 -m bench.interleaved --out FILE --block 40 --log-every 10 \\
        --cycles 60 --variants plain,plain-gather,kit,kit-nolog,kit-nostop -- <train flags>

On a shared machine, separate launches of each loop see different background load; here
every cycle runs one block of `--block` steps of each variant back to back (order rotated
per cycle), so a kit block and the plain block it is compared with are a fraction of a
second apart. `python -m ddpkit.train` runs unchanged; a wrapper around Trainer.train_step, at the
start of every `--block`-th kit step, closes the kit block just finished (its time includes
each step's logging, checkpoint poll and stop-signal check, since it runs from one block
start to the next), runs the plain blocks due next (bench.plain_ddp.PlainLoop: its own
model, DDP, sampler and AdamW on the kit's data tensors; plain-fsdp: bench.plain_fsdp, an
hf: model under FSDP2 by hand), and switches the kit variant:
  kit         as users run it, logging every `--log-every` steps (a divisor of --block)
  kit-nolog   --log-interval set above the run length for this block (no logging step)
  kit-nostop  StopRequest.agreed patched to "no signal" (no per-step all_reduce)
and the plain loop (bench.plain_ddp.PlainLoop):
  plain         DataLoader, per-sample collate
  plain-gather  one gather per batch (the kit's data path for in-memory tensors)
  plain-log     plain-gather that also logs every `--log-every` steps as a plain script
                does: the loss all-reduced, read, and printed by rank 0
Both ranks follow the same schedule, so their collectives stay matched. Blocks start half a
logging interval off the logging steps: a logging step's all-reduce, which the kit finishes
in the next step, falls inside the block that started it, not across a plain block.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

KIT = ("kit", "kit-nolog", "kit-nostop")
PLAIN = ("plain", "plain-gather", "plain-log", "plain-fsdp")


def schedule(variants: list[str], cycles: int) -> list[tuple[int, str]]:
    out = []
    for c in range(cycles):
        k = c % len(variants)
        out += [(c, v) for v in variants[k:] + variants[:k]]
    return out


def kit_steps(variants: list[str], cycles: int, block: int) -> int:
    """--steps the kit needs: every kit block, plus one step that closes the last block."""
    return cycles * block * sum(v in KIT for v in variants) + 1


def main(argv: list[str] | None = None) -> int:
    # The exit waits for gloo's threads, as the kit's does (train/teardown.py): under torch
    # 2.14 a rank of a plain gloo loop sometimes aborted at exit ("terminate called without
    # an active exception", SIGABRT) after its last step, failing the launch (CI, ci9). It
    # changes nothing before the exit, so the step times compared stay a plain loop's.
    from ddpkit.train import teardown

    teardown.install()
    p = argparse.ArgumentParser(prog="python -m bench.interleaved")
    p.add_argument("--out", required=True)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--log-every", type=int, default=0, help="the kit's logging interval (--block)")
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--variants", default="plain,kit")
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    variants = args.variants.split(",")
    unknown = set(variants) - set(KIT) - set(PLAIN)
    if unknown or not any(v in KIT for v in variants):
        p.error(f"--variants: need at least one kit variant; unknown: {sorted(unknown)}")

    import ddpkit.train.__main__ as train_main
    from ddpkit.train import signals
    from ddpkit.train.loop import trainer

    from bench.common import write_json
    from bench.plain_ddp import PlainLoop

    block = args.block
    log_every = args.log_every or block
    if block % log_every:
        p.error(f"--log-every {log_every} must divide --block {block}")
    plan = schedule(variants, args.cycles)
    blocks: list[dict] = []
    loops: dict[str, PlainLoop] = {}
    orig_step, orig_agreed = trainer.Trainer.train_step, signals.StopRequest.agreed
    st: dict = {"pos": 0, "current": None, "count": 0, "start": 0.0, "stamps": []}

    def plain_loop(tr, v: str) -> PlainLoop:
        if v == "plain-fsdp" and v not in loops:  # an hf: model under FSDP2, by hand
            from bench.plain_fsdp import PlainFSDPLoop

            loops[v] = PlainFSDPLoop(tr.cfg, tr.data)
        if v not in loops:  # built lazily: DDP's constructor broadcasts, on both ranks alike
            c = tr.cfg
            mode = "loader" if v == "plain" else "gather"
            every = log_every if v == "plain-log" else 0
            loops[v] = PlainLoop(c, tr.data, c.batch_size, c.lr, c.weight_decay, mode, every)
        return loops[v]

    def advance(tr) -> None:
        """Run the plain blocks due next, then set up the next kit block (None: done)."""
        while st["pos"] < len(plan):
            c, v = plan[st["pos"]]
            st["pos"] += 1
            if v in PLAIN:
                loop = plain_loop(tr, v)
                t0 = time.perf_counter()
                ends = loop.run(block)
                blocks.append(
                    {"variant": v, "cycle": c, "s": ends[-1] - t0, "steps": _diffs([t0, *ends])}
                )
                continue
            signals.StopRequest.agreed = (lambda s, d: 0) if v == "kit-nostop" else orig_agreed
            tr.cfg.log_interval = 10**9 if v == "kit-nolog" else log_every
            st["current"] = (c, v)
            return
        st["current"] = None

    def timed_step(tr, batches):
        now = time.perf_counter()
        if st["count"] == block or (st["current"] is None and st["pos"] == 0):
            if st["current"] is not None:
                c, v = st["current"]
                steps = _diffs([*st["stamps"], now])
                blocks.append({"variant": v, "cycle": c, "s": now - st["start"], "steps": steps})
            first = st["current"] is None
            advance(tr)
            # the first block (warmup) is shorter: the others start half an interval off
            st["count"] = log_every // 2 if first else 0
            st["start"], st["stamps"] = time.perf_counter(), []
        st["stamps"].append(time.perf_counter())  # each kit step: entry to next entry
        st["count"] += 1
        return orig_step(tr, batches)

    trainer.Trainer.train_step = timed_step
    rc = train_main.main(train_args)
    if os.environ.get("RANK", "0") == "0":
        write_json(
            Path(args.out),
            {
                "rc": rc,
                "block": block,
                "cycles": args.cycles,
                "variants": variants,
                "blocks": blocks,
            },
        )
    return rc


def _diffs(stamps: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in zip(stamps, stamps[1:], strict=False)]


if __name__ == "__main__":
    sys.exit(main())
