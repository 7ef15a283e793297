"""A plain PyTorch DDP script that knows nothing of ddpkit: what people run with torchrun.

    torchrun --standalone --nproc-per-node 2 examples/plain_torchrun/ddp_fit.py --steps 50

ddpkit runs it unchanged on every backend (examples/plain_torchrun/job.toml):

    ddpkit submit local --config examples/plain_torchrun/job.toml
    make slurm-submit NODES=2 GPUS=2 CONFIG=examples/plain_torchrun/job.toml

It fits y = x @ w_true with a linear layer on random data drawn from a fixed seed, and rank
0 writes the result (world size, first and last loss) as JSON to --out.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", default="runs/plain-torchrun/result.json")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    w_true = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    losses = []
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=gen)
        y = x @ w_true
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        result = {"world_size": world, "first_loss": losses[0], "last_loss": losses[-1]}
        with open(args.out, "w") as f:
            json.dump(result, f)
        print(f"rank 0: world size {world}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
