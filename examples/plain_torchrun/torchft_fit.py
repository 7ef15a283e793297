"""A plain torchrun script made fault tolerant with torchft's Manager, run as ddpkit replica
groups: the kit starts the lighthouse and one torchrun per group, and gives every rank
TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID and NUM_REPLICA_GROUPS (docs/fault-tolerance.md).

    ddpkit run --config examples/plain_torchrun/job.toml --set fault_tolerance=torchft \
        --set script=torchft_fit.py

It fits y = x @ w_true like ddp_fit.py. Inside a group DDP averages the gradients; torchft's
Manager averages them across the live groups, agrees on them before every step (the quorum)
and hands a rejoining group the model, optimizer and step of a live peer (state_dict /
load_state_dict below). Each group's rank 0 writes its result to --out with `-group<g>`
before the suffix.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torchft
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", default="runs/plain-torchrun/result.json")
    args = p.parse_args()

    group = int(os.environ["REPLICA_GROUP_ID"])  # set by ddpkit for each replica group
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    dist.init_process_group("gloo")  # this group's ranks only (its own torchrun)
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # every group starts from the same weights
    w_true = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    def state_dict() -> dict:
        return {"model": model.module.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(),  # rank r of every group, re-formed at each quorum
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        use_async_quorum=False,
        replica_id=f"group_{group}",  # the lighthouse address comes from TORCHFT_LIGHTHOUSE
        init_sync=False,  # same seed everywhere
    )
    optimizer = torchft.Optimizer(manager, opt)  # zero_grad: quorum; step: only if committed
    losses = []
    while manager.current_step() < args.steps:
        step = manager.current_step()  # a step that was not committed runs again
        gen = torch.Generator().manual_seed(1000 * step + group * size + rank)
        x = torch.randn(args.batch_size, 16, generator=gen)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
        loss.backward()  # DDP: the mean over this group's ranks
        for param in model.parameters():  # torchft: the mean over the live groups
            manager.allreduce(param.grad).wait()
        if step == 0 and manager.num_participants() < groups:
            # Start with every group: without this, the first group up trains alone and the
            # lighthouse may keep forming quorums of it while the others wait to be let in.
            manager.report_error(RuntimeError("not every replica group has joined yet"))
        optimizer.step()  # steps the model only when every group in the quorum commits
        losses.append(loss.item())
    if rank == 0:
        stem, ext = os.path.splitext(os.path.abspath(args.out))
        out = f"{stem}-group{group}{ext}"
        os.makedirs(os.path.dirname(out), exist_ok=True)
        weights = [round(v, 6) for v in model.module.weight.flatten().tolist()]
        with open(out, "w") as f:
            json.dump({"group": group, "groups": groups, "steps": step + 1, "weights": weights}, f)
        print(f"group {group} of {groups}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    manager.shutdown(wait=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
