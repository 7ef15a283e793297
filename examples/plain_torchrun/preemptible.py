"""The plain script plus the ddpkit preemption contract (train/preempt.py): on a stop
signal it saves in $DDPKIT_CKPT_DIR, asks for a requeue and exits; run again, it resumes
from that checkpoint.

    ddpkit submit local --config examples/plain_torchrun/job.toml \
        --set script=preemptible.py
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from ddpkit.train import preempt  # import-light: no torch, nothing else of ddpkit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-s", type=float, default=0.0, help="sleep per step (a slow step)")
    p.add_argument("--out", default="runs/plain-torchrun/result.json")
    args = p.parse_args()
    preempt.install()  # first: a signal during startup must not kill the process

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # The job's checkpoint dir (its ckpt_dir, else <run dir>/checkpoints): it outlives the
    # node and the container. The launcher names it but does not create it.
    ckpt_dir = os.environ.get("DDPKIT_CKPT_DIR", "runs/plain-torchrun/checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt = os.path.join(ckpt_dir, "ckpt.pt")
    model = torch.nn.Linear(16, 1)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        start = state["step"]
    if rank == 0:
        print(f"rank 0: started at step {start}", flush=True)
    for step in range(start, args.steps):
        time.sleep(args.step_s)
        # Every rank must agree before a collective save: one all_reduce of the signal, not
        # of a flag, so a rank that learns of a plain scancel from a peer knows it was one.
        sig = torch.tensor([preempt.signal_number()])
        dist.all_reduce(sig, op=dist.ReduceOp.MAX)
        if preempt.agree(int(sig.item())):
            if rank == 0:
                torch.save({"model": model.state_dict(), "step": step}, ckpt)
            dist.barrier()
            preempt.request_requeue(step=step)  # each node's local rank 0 writes the marker
            print(f"rank {rank}: stop at step {step}, {preempt.seconds_left():.0f} s left")
            dist.destroy_process_group()
            return
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"start": start, "steps": args.steps}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
