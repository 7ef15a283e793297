"""The baseline: a DDP training loop written the plain way, nothing else.

    torchrun --nproc-per-node 2 -m bench.plain_ddp --out FILE [--model mlp] [--steps 200]

DDP + DistributedSampler + DataLoader + AdamW, as in the PyTorch DDP tutorial. The data and
the model come from the kit's builders (ddpkit.train.data.build_data, ddpkit.train.models.build_model) so
both loops train the same network on the same tensors with the same per-rank batch; the
loop itself uses none of the kit. Rank 0 writes the same timestamps as bench.kit_timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

T_IMPORT = time.time()


def main(argv: list[str] | None = None) -> int:
    # The exit waits for gloo's threads, as the kit's does (train/teardown.py): under torch
    # 2.14 a rank of a plain gloo loop sometimes aborted at exit ("terminate called without
    # an active exception", SIGABRT) after its last step, failing the launch (CI, ci9). It
    # changes nothing before the exit, so the step times compared stay a plain loop's.
    from ddpkit.train import teardown

    teardown.install()
    p = argparse.ArgumentParser(prog="python -m bench.plain_ddp")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes the timestamps to")
    p.add_argument("--model", choices=("mlp", "mlp-deep"), default="mlp")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0, help="the kit's default: 0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-samples", type=int, default=8192)
    p.add_argument(
        "--data",
        choices=("loader", "gather"),
        default="loader",
        help="loader: DataLoader over the dataset (the plain way); gather: index the in-memory "
        "tensors with the sampler's batch, the data path the kit uses for tensor data",
    )
    p.add_argument(
        "--probe-collectives",
        type=int,
        default=0,
        metavar="N",
        help="after the timed loop, time N one-int all_reduce + .item() calls (the kit's "
        "per-step stop-signal check) in isolation",
    )
    args = p.parse_args(argv)

    t0 = time.time()
    import torch
    import torch.distributed as dist
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.data import build_data

    from bench.common import write_json

    phases = [("import torch+train", t0, time.time())]

    t0 = time.time()
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank = dist.get_rank()
    phases.append(("init process group", t0, time.time()))

    t0 = time.time()
    cfg = TrainConfig(model=args.model, synthetic_samples=args.synthetic_samples, seed=args.seed)
    data = build_data(cfg)
    phases.append(("build data", t0, time.time()))

    t0 = time.time()
    loop = PlainLoop(cfg, data, args.batch_size, args.lr, args.weight_decay, args.data)
    phases.append(("build model + DDP/FSDP", t0, time.time()))

    step_ends = loop.run(1)
    first_step_wall = time.time()
    step_ends += loop.run(args.steps - 1)

    final_loss = float(loop.loss)
    probe = probe_stop_allreduce(args.probe_collectives) if args.probe_collectives else None
    if rank == 0:
        from pathlib import Path

        write_json(
            Path(args.out),
            {
                "variant": "plain" if args.data == "loader" else "plain-gather",
                "rc": 0,
                "t_import": T_IMPORT,
                "t_first_step": first_step_wall,
                "step_ends": step_ends,
                "final_loss_rank0": final_loss,
                "probe_stop_allreduce_s": probe,
                "phases": [{"phase": n, "start": a, "s": b - a} for n, a, b in phases],
            },
        )
    dist.barrier()  # tear down together: gloo can abort a rank whose peer is already gone
    dist.destroy_process_group()
    return 0


class PlainLoop:
    """The plain loop's state; run(n) trains n more steps and returns their end times."""

    def __init__(
        self, cfg, data, batch_size: int, lr: float, weight_decay: float, mode: str, log_every=0
    ):
        import torch
        from ddpkit.train.models import build_model
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler = DistributedSampler(data.train, shuffle=True, seed=cfg.seed, drop_last=True)
        if mode == "loader":
            self.loader = DataLoader(
                data.train, batch_size=batch_size, sampler=self.sampler, drop_last=True
            )
        else:
            self.loader = TensorBatches(data.train.tensors, self.sampler, batch_size)
        torch.manual_seed(cfg.seed)
        self.model = DDP(build_model(cfg, data.in_shape, data.num_classes))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=weight_decay
        )
        self.batches = self._epochs()
        self.loss = None
        self.step, self.log_every = 0, log_every

    def _epochs(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            yield from self.loader
            epoch += 1

    def run(self, n: int) -> list[float]:
        import torch.nn.functional as F

        ends = []
        for _ in range(n):
            x, y = next(self.batches)
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.step += 1
            if self.log_every and self.step % self.log_every == 0:
                self._log(loss)
            ends.append(time.perf_counter())
        self.loss = loss
        return ends

    def _log(self, loss) -> None:
        """What a plain script's log line costs: the loss averaged over ranks (one
        all-reduce, read on the host), printed by rank 0."""
        import torch.distributed as dist

        t = loss.detach().clone()
        dist.all_reduce(t)
        avg = t.item() / dist.get_world_size()
        if dist.get_rank() == 0:
            print(f"step {self.step} loss {avg:.4f}", flush=True)


class TensorBatches:
    """The sampler's indices in batches, one tensor gather per batch (no per-sample collate)."""

    def __init__(self, tensors, sampler, batch_size: int) -> None:
        self.tensors, self.sampler, self.batch_size = tensors, sampler, batch_size

    def __iter__(self):
        import torch

        idx = list(self.sampler)
        for lo in range(0, len(idx) - self.batch_size + 1, self.batch_size):
            t = torch.tensor(idx[lo : lo + self.batch_size])
            yield tuple(x[t] for x in self.tensors)


def probe_stop_allreduce(n: int) -> dict[str, float]:
    """Median and mean seconds of the kit's stop check alone: MAX all_reduce of one int32,
    then .item() (ddpkit.train.signals.StopRequest.agreed). Not part of the plain loop's timing."""
    import statistics

    import torch
    import torch.distributed as dist

    flag = torch.zeros(1, dtype=torch.int32)
    times = []
    dist.barrier()
    for _ in range(n):
        t0 = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        int(flag.item())
        times.append(time.perf_counter() - t0)
    return {"median": statistics.median(times), "mean": statistics.fmean(times), "n": n}


if __name__ == "__main__":
    sys.exit(main())
