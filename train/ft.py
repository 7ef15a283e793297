"""Per-step fault tolerance across replica groups with torchft (`fault_tolerance = "torchft"`).

The job is split into replica groups, each its own torchrun (its own rendezvous, so one group
can die and be restarted while the others go on). Inside a group the job's strategy runs as
usual over the group's ranks: DDP, or FSDP2 with any sharding (then the job is HSDP whose
replicate dimension is the replica groups, made fault tolerant). Across groups, rank r of
every group averages its gradients with rank r of the others through torchft's Manager,
which agrees on the live groups with the lighthouse before every step (the quorum). Every
group has the same size and the same mesh, so rank r holds the same shard in every group:
under FSDP the cross-group average, and a heal, move each rank's local shards only.

What this module decides (docs/fault-tolerance.md says it to users):
- Data: the job's global order is cut for ALL groups (data world = groups x group size; group
  g, rank r reads slot g * size + r of every global batch). The position is a function of the
  committed step, the same on every group. A group that is down does not read its slots: its
  in-flight batch and every batch it would have read while down are SKIPPED (never re-read by
  another group), so each sample is seen at most once per epoch, and exactly once when no
  group is lost. A step whose cross-group all-reduce failed (a peer died mid-step) is not
  committed on that group: its sampler is rewound and the step re-read with the next quorum.
- LR and global batch stay FIXED by design: the peak LR comes from the full job's global batch
  (all groups) and the schedule from the committed step. The gradient is a mean over the live
  groups' samples (torchft divides by the participants), so losing a group makes a step
  noisier, not larger; a short outage is not worth a schedule change.
- A group that (re)joins behind the others heals from a live peer at the quorum: model,
  optimizer, step and data position come over torchft's checkpoint transport; its RNG is
  re-seeded from (seed, its data rank, step) rather than copied (a copy would give two groups
  the same dropout stream).
- Storage checkpoints still go to each group's own checkpoint dir on their interval: a
  whole-job failure resumes from them; a group that resumes behind the others heals.
"""

from __future__ import annotations

import atexit
import datetime
import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train.ckpt import RngState
from ddpkit.train.data import GlobalBatchSampler, iterate_batches
from ddpkit.train.data.loader import _trace_file
from ddpkit.train.errors import ConfigError
from ddpkit.train.ft_env import ReplicaGroup

# `Trainer` below is ddpkit.train.loop.trainer.Trainer (not imported: it imports this module).
Trainer = Any

# Every rank of every group was built from the same seed: no weight sync at step 0.
INIT_SYNC = False
# A gradient of this many elements or more is all-reduced across groups where it lies (1 MiB
# in fp32); the smaller ones are copied into one flat buffer and sent together.
IN_PLACE_NUMEL = 1 << 18


def buckets_across_groups(cfg: Any, world: Any) -> bool:
    """Whether this rank's cross-group all-reduce runs inside backward, bucket by bucket, in
    DDP's comm hook (CpuBuckets below): a DDP group on the CPU under torchft. DDP must then
    keep its first bucket layout (parallel.apply_ddp). FSDP groups, and DDP on GPUs (not
    tested here: no GPU), all-reduce after backward (average_gradients)."""
    try:
        group = ReplicaGroup.from_env()
    except ValueError:
        return False  # attach() says why, in one line
    return group is not None and cfg.parallel == "ddp" and world.device.type == "cpu"


def attach(trainer: Trainer) -> FaultTolerance | None:
    """Make `trainer` one replica group of a torchft job when the environment says so."""
    try:
        group = ReplicaGroup.from_env()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if group is None:
        return None
    return FaultTolerance(trainer, group)


class FaultTolerance:
    def __init__(self, trainer: Trainer, group: ReplicaGroup) -> None:
        from torchft.manager import Manager

        self.t, self.group = trainer, group
        cfg, world = trainer.cfg, trainer.world
        self.data_size = group.groups * world.size
        self.data_rank = group.group * world.size + world.rank
        self._data_world(trainer)
        self._reseed(0)
        trainer.states["rng"] = RngState(self.data_rank)
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        self.manager = Manager(
            pg=_cross_group_pg(world.device, timeout),
            load_state_dict=None,
            state_dict=None,
            min_replica_size=1,  # a lone survivor keeps training
            use_async_quorum=False,  # heal before the forward: the step reads healed data
            replica_id=f"ddpkit_group_{group.group}",  # the trailing digits name the group
            rank=world.rank,
            world_size=world.size,
            timeout=timeout,
            init_sync=INIT_SYNC,
            lighthouse_addr=group.lighthouse,
        )
        self.manager.register_state_dict_fn("ddpkit", self._load, self._state)
        self.in_backward = buckets_across_groups(cfg, world)
        if self.in_backward:
            trainer.model.register_comm_hook(None, CpuBuckets(self.manager, world.size).hook)
        trainer.optimizer = CommittingOptimizer(self, trainer.optimizer)
        self.committed = True
        self.stale = False  # the data position moved under the batch iterator
        self.position: dict[str, int] = {}
        self.participants = group.groups
        self.healed_at: list[int] = []
        self.waited = False
        self.joined = False  # no step committed by this process yet
        # test hook (DDPKIT_TRACE_SAMPLES): after each batch this data rank is handed, whether
        # its step was committed, in the same file (tests/process/train/test_torchft_data.py)
        self.trace = _trace_file(self.data_rank)
        atexit.register(self.manager.shutdown, wait=False)

    def line(self) -> str:
        return (
            f"torchft: replica group {self.group.group} of {self.group.groups} "
            f"(lighthouse {self.group.lighthouse}); data rank {self.data_rank} of "
            f"{self.data_size}, global batch {self.t.global_batch} when every group is live"
        )

    # --- data -----------------------------------------------------------------------------

    def _data_world(self, t: Trainer) -> None:
        """The sampler, step count, global batch and peak LR of the whole job (all groups)."""
        from ddpkit.train.loop.schedule import scaled_lr  # (the loop package imports us)

        cfg = t.cfg
        t.sampler = GlobalBatchSampler(
            len(t.data.train), cfg.batch_size, self.data_size, self.data_rank, cfg.seed
        )
        t.states["sampler"] = t.sampler
        per_epoch = t.sampler.batches_per_epoch() // cfg.grad_accum
        if per_epoch < 1:
            raise ConfigError(
                f"the dataset has {len(t.data.train)} samples, fewer than one global batch of "
                f"the replica groups (batch {cfg.batch_size} x group size {t.world.size} x "
                f"groups {self.group.groups} x grad-accum {cfg.grad_accum}); lower --batch-size"
            )
        t.total_steps = cfg.steps or (cfg.epochs or 1) * per_epoch
        t.global_batch = cfg.batch_size * self.data_size * cfg.grad_accum
        t.peak_lr = scaled_lr(cfg.lr, cfg.lr_scaling, t.global_batch, cfg.base_batch_size)

    def batches(self) -> Iterator[Any]:
        """The trainer's micro-batches, rebuilt from the sampler whenever a heal or an
        uncommitted step moved the position."""
        while True:
            self.stale = False
            t = self.t  # named by the data rank: every group has a rank 0
            inner = iterate_batches(
                t.data.train, t.sampler, t.world.device, t.cfg.num_workers, self.data_rank
            )
            try:
                for batch in inner:
                    yield batch
                    if self.stale:
                        break
            finally:
                inner.close()  # type: ignore[attr-defined]

    def _reseed(self, step: int) -> None:
        # Distinct per data rank, reproducible per step (a healed group's stream).
        torch.manual_seed((self.t.cfg.seed + 1 + self.data_rank) * 1_000_003 + step)

    # --- the step -------------------------------------------------------------------------

    def begin_step(self) -> None:
        """The quorum (and a heal, when this group is behind), before the forward."""
        t = self.t
        self.position = t.sampler.state_dict()
        if self.manager.current_step() != t.step:  # a storage resume moved the step
            self.manager.load_state_dict(
                {"step": t.step, "batches_committed": self.manager.batches_committed()}
            )
        t.phase = "torchft quorum"
        self.manager.start_quorum()
        self.participants = self.manager.num_participants()

    def commit(self, step_optimizer) -> bool:
        t = self.t
        # The job starts, and resumes from storage, with every group, not with the first one
        # up: a step taken alone there would differ from the run that never stopped.
        starting = not self.joined and self.participants < self.group.groups
        if starting:
            self.manager.report_error(RuntimeError("not every replica group has joined yet"))
        t.phase = "torchft should_commit"
        self.committed = self.manager.should_commit()
        if self.trace is not None:
            self.trace.write(f"commit {t.step + 1} {int(self.committed)} {self.participants}\n")
        if self.committed:
            self.joined = True
            step_optimizer()
        else:  # the gradients are not the live groups' mean: re-read this step's batch
            t.sampler.load_state_dict(self.position)
            self.stale = True
            if starting:
                if not self.waited:
                    t.reporter.info(
                        f"torchft: waiting for every replica group to join step {t.step + 1}"
                    )
                self.waited = True
                return False
            t.reporter.info(
                f"torchft: step {t.step + 1} not committed (a replica group left during it); "
                "retrying it with the next quorum"
            )
        return self.committed

    def average_gradients(self) -> None:
        """After backward (FSDP reduce-scattered, or DDP on a GPU averaged, inside the group):
        the mean over the live groups, in parameter order; under FSDP of this rank's gradient
        shards. (A DDP group on the CPU did it inside backward: CpuBuckets.) A large gradient
        is all-reduced where it lies; the small ones share one flat buffer (one round trip,
        not one each); every all-reduce is issued before the first wait. Flattening them all
        cost more than the all-reduce itself on a 29M-parameter model
        (bench/torchft_overhead.py --model mlp-deep: 56 ms to flatten, 12 ms to copy back,
        111 ms to all-reduce, in a 500 ms step)."""
        if self.in_backward:
            return  # done bucket by bucket in DDP's comm hook (CpuBuckets)
        grads = [_local(p.grad) for p in self.t.model.parameters() if p.grad is not None]
        if not grads:
            return
        self.t.phase = "torchft gradient all_reduce across replica groups"
        large, small = [], []
        for g in grads:
            (large if g.numel() >= IN_PLACE_NUMEL and g.is_contiguous() else small).append(g)
        flat = torch._utils._flatten_dense_tensors(small) if small else None
        sent = large + [flat] if flat is not None else large
        works = [self.manager.allreduce(g) for g in sent]  # torchft divides by the participants
        for w in works:
            w.wait()
        if flat is not None:
            for g, avg in zip(
                small, torch._utils._unflatten_dense_tensors(flat, small), strict=True
            ):
                g.copy_(avg)

    # --- heal (torchft's state-dict callbacks) --------------------------------------------

    def _state(self) -> dict[str, Any]:
        t = self.t
        return {  # under FSDP, each DTensor as this rank's shard: see _local_tree
            "model": _local_tree(t.states["model"].state_dict()),
            "optim": _local_tree(t.states["optim"].state_dict()),
            "sampler": t.sampler.state_dict(),
            "step": t.step,
            "first_loss": t.first_loss,
        }

    def _load(self, state: dict[str, Any]) -> None:
        t = self.t
        t.ckpt.wait_staging()  # an async save still copying the weights it replaces here
        sharded = t.cfg.parallel == "fsdp"  # a DDP group's state has no DTensor to rebuild
        for part in ("model", "optim"):
            mine = t.states[part]
            like = mine.state_dict() if sharded else None
            mine.load_state_dict(_as_dtensors(like, state[part]))
        t.sampler.load_state_dict(state["sampler"])
        before, t.step = t.step, int(state["step"])
        if t.first_loss is None:
            t.first_loss = state["first_loss"]
        self._reseed(t.step)
        self.stale = True
        self.healed_at.append(t.step)
        t.reporter.info(
            f"torchft: replica group {self.group.group} healed from a live peer: step "
            f"{before} -> {t.step} (model, optimizer, data position)"
        )


class CommittingOptimizer:
    """The trainer's optimizer, stepped only when torchft commits the step."""

    def __init__(self, ft: FaultTolerance, optim: torch.optim.Optimizer) -> None:
        self.ft, self.optim = ft, optim

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @property
    def state(self) -> Any:
        return self.optim.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.ft.begin_step()
        self.optim.zero_grad(set_to_none=set_to_none)

    def step(self, closure: None = None) -> None:
        self.ft.commit(self.optim.step)

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optim.load_state_dict(state)


class CpuBuckets:
    """DDP's comm hook for a DDP group on the CPU under torchft: each gradient bucket is
    averaged inside the group, then across the live groups, while backward goes on computing
    the next buckets (as plain DDP overlaps its own all-reduce). The hook only starts the
    group's all-reduce and hands the bucket to one thread, which waits for it and runs the
    cross-group all-reduce, buckets in order; DDP waits for every bucket's future before
    backward returns. The order pairs up across groups because every group keeps DDP's
    first bucket layout (parallel.apply_ddp). A failed cross-group all-reduce is torchft's
    to report (the step is then not committed); a failed in-group one fails backward, as
    under plain DDP."""

    def __init__(self, manager: Any, group_size: int) -> None:
        self.manager, self.group_size = manager, group_size
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="ddpkit-torchft-buckets", daemon=True).start()

    def hook(self, _state, bucket):  # unannotated: DDP checks the annotations it is given
        """DDP's comm hook: a bucket's gradients in, a future of their mean out."""
        buf = bucket.buffer()
        inner = None
        if self.group_size > 1:
            buf.div_(self.group_size)
            inner = dist.all_reduce(buf, async_op=True)
        done: torch.futures.Future = torch.futures.Future()
        self.todo.put((inner, buf, done))
        return done

    def _serve(self) -> None:
        while True:
            inner, buf, done = self.todo.get()
            try:
                if inner is not None:
                    inner.wait()
                self.manager.allreduce(buf).wait()  # torchft divides by the participants
                done.set_result(buf)
            except BaseException as e:  # to backward, which raises it
                done.set_exception(e)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its storage, not a copy); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _local_tree(tree: Any) -> Any:
    """A state dict with every DTensor replaced by this rank's shard of it. torchft's HTTP
    transport pickles what it is given, and a DTensor carries its device mesh (process groups
    that do not pickle); rank r of the peer group holds the same shard, so the shard is all a
    rank needs to send. A DDP group's state has no DTensor and passes through."""
    if isinstance(tree, dict):
        return {k: _local_tree(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_local_tree(v) for v in tree)
    return _local(tree) if isinstance(tree, torch.Tensor) else tree


def _as_dtensors(template: Any, shards: Any) -> Any:
    """The peer's shards (from _local_tree) as DTensors laid out like this rank's own
    state (`template`: the same mesh, placements and global shape), for DCP's set_*_state_dict.
    No collective: every rank wraps its own shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(shards, dict) and isinstance(template, dict):
        return {k: _as_dtensors(template.get(k), v) for k, v in shards.items()}
    if isinstance(shards, list | tuple) and isinstance(template, list | tuple):
        if len(shards) == len(template):
            return type(shards)(_as_dtensors(a, b) for a, b in zip(template, shards, strict=True))
        return shards
    if isinstance(template, DTensor) and isinstance(shards, torch.Tensor):
        return DTensor.from_local(
            shards.to(template.device),
            template.device_mesh,
            template.placements,
            run_check=False,
            shape=template.shape,
            stride=template.stride(),
        )
    return shards


def _cross_group_pg(device: torch.device, timeout: datetime.timedelta):
    import torchft

    if device.type == "cuda":
        return torchft.ProcessGroupNCCL(timeout=timeout)
    return torchft.ProcessGroupGloo(timeout=timeout)
