"""The training loop: state up front, `train()` short, one step in `train_step`; how a run
ends (summary, signal, divergence) is its base class, ending.RunEnd."""

from __future__ import annotations

import contextlib
import datetime
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train import resolve
from ddpkit.train.ckpt import (
    Checkpointer,
    ModelState,
    OptimizerState,
    RngState,
    Stateful,
    Values,
    check_resume_path,
)
from ddpkit.train.config import (
    ConfigError,
    TrainConfig,
    log_backends,
    profile_range,
)
from ddpkit.train.data import DataBundle, GlobalBatchSampler, iterate_batches
from ddpkit.train.data.sampler import check_same_length
from ddpkit.train.diagnosis import diagnose_collective_failure, is_collective_error
from ddpkit.train.distributed import World
from ddpkit.train.divergence import Diverged, Health
from ddpkit.train.drills import Fault, pace, step_pace_s
from ddpkit.train.ft import attach as attach_ft
from ddpkit.train.ft import buckets_across_groups
from ddpkit.train.loop.ending import RunEnd
from ddpkit.train.loop.evaluate import held_out
from ddpkit.train.loop.logstep import LogSteps, PendingLog
from ddpkit.train.loop.rundir import claim_run_dirs
from ddpkit.train.loop.schedule import lr_multiplier, scaled_lr
from ddpkit.train.metrics import (
    Reporter,
    peak_flops,
)
from ddpkit.train.parallel import DTYPES, parallelize, set_grad_sync
from ddpkit.train.profiling import StepProfiler
from ddpkit.train.signals import StopRequest


class CollectiveFailure(RuntimeError):
    pass


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The gradients' L2 norm, as torch.nn.utils.get_total_norm computes it. When every
    gradient is a plain tensor on one device in one dtype (DDP's), the same two ops without
    its grouping pass: a third of its time, on a logging step of a small model."""
    if grads:
        t0 = grads[0]
        if all(
            type(g) is torch.Tensor and g.device == t0.device and g.dtype == t0.dtype for g in grads
        ):
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return torch.nn.utils.get_total_norm(grads)


class Trainer(LogSteps, RunEnd):
    def __init__(self, cfg: TrainConfig, world: World, states: dict[str, Any] | None = None):
        self.cfg, self.world = cfg, world
        self.t_start = time.perf_counter()
        self.run_dir = Path(cfg.run_dir)
        self.spec = resolve.model_spec(cfg)
        self.loss_fn = resolve.loss_fn(cfg, self.spec)
        self.data = self._load_data()
        # Same seed on every rank: identical initial weights without a broadcast.
        torch.manual_seed(cfg.seed)
        model = self.spec.build(cfg, self.data)
        self.num_params = sum(p.numel() for p in model.parameters())
        flops = self.spec.flops_per_token
        self.flops_per_token = flops(cfg, model) if flops else None
        self.model, self.raw_model = parallelize(
            model, cfg, world, stable_buckets=buckets_across_groups(cfg, world)
        )
        self.optimizer = self._build_optimizer()
        # Per-rank seed from here on: dropout and augmentation differ across ranks.
        torch.manual_seed(cfg.seed + 1 + world.rank)
        self.sampler = GlobalBatchSampler(
            len(self.data.train), cfg.batch_size, world.size, world.rank, cfg.seed
        )
        check_same_length(len(self.data.train), world)
        per_epoch = self.sampler.batches_per_epoch() // cfg.grad_accum
        if per_epoch < 1:
            raise ConfigError(
                f"the dataset has {len(self.data.train)} samples, fewer than one global batch "
                f"(batch {cfg.batch_size} x world {world.size} x grad-accum {cfg.grad_accum}); "
                "lower --batch-size or --grad-accum"
            )
        self.total_steps = cfg.steps or (cfg.epochs or 1) * per_epoch
        self.global_batch = cfg.batch_size * world.size * cfg.grad_accum
        self.peak_lr = scaled_lr(cfg.lr, cfg.lr_scaling, self.global_batch, cfg.base_batch_size)
        self.step = 0
        self.phase = "startup"
        check_resume_path(cfg.resume)  # a broken --resume PATH: one line, nothing written
        self.locks = claim_run_dirs(cfg, world)
        self.lock = self.locks[0]
        self.barrier("start-up barrier", when="at start-up")
        # The job's timeout for the groups made here: a new group gets torch's 30 min.
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        # Control messages (the stop flag) go over gloo on the CPU: no GPU sync per step.
        self.control_pg = (
            dist.new_group(backend="gloo", timeout=timeout) if world.backend != "gloo" else None
        )
        self.stop_every = 1  # steps between stop-signal agreements; set at each logging step
        self.stop = StopRequest(boundary_timeout_s=cfg.timeout_s)
        self.fault = Fault.from_env()
        self.pace_s = step_pace_s()
        self.reporter = Reporter(
            self.run_dir,
            world.is_main,
            self.total_steps,
            cfg.progress,
            log_backends(cfg),
            cfg.to_dict(),
        )
        self.profiler = StepProfiler(
            profile_range(cfg.profile_steps), self.run_dir, world.rank, world.device
        )
        self.ckpt = Checkpointer(
            cfg.ckpt_dir, cfg.ckpt_keep, cfg.ckpt_async, self.reporter.info, timeout, self.run_dir
        )
        self.scaler = (
            torch.amp.GradScaler(world.device.type) if cfg.mixed_precision == "fp16" else None
        )
        self.first_loss: float | None = None  # the run's, kept across attempts (train state)
        self.pending_log: PendingLog | None = None
        self.last_loss: float | None = None
        self._resumed: dict[str, Any] = {}  # the train state a checkpoint held
        # What a checkpoint holds, by name: adding a part is one line (anything with
        # state_dict/load_state_dict); a part an older checkpoint lacks keeps its fresh value.
        self.states: dict[str, Stateful] = {
            "model": ModelState(self.raw_model),
            "optim": OptimizerState(self.raw_model, self.optimizer),
            "train": Values(self._train_state, self._resumed.update),
            "sampler": self.sampler,
            "rng": RngState(world.rank),
        }
        if self.scaler is not None:
            self.states["scaler"] = self.scaler
        self.states.update({f"user_{k}": v for k, v in (states or {}).items()})  # train.fit
        self.throughputs: list[float] = []
        self.mfus: list[float] = []
        self.peak_flops = peak_flops(world.device, cfg.peak_tflops)
        self.resumed_from: str | None = None
        self.time_to_first_step: float | None = None
        self.last_saved = -1
        self.late_signal = 0  # a stop signal agreed only after the last step
        self.health = Health(world.device, cfg.max_bad_steps)
        # what a forward/backward waits on, named by a hang's message (set every step)
        what = (
            "DDP gradient all_reduce"
            if cfg.parallel == "ddp"
            else f"FSDP2 {cfg.sharding} all_gather/reduce_scatter"
        )
        self.fwd_bwd_phase = f"forward/backward ({what})"
        self.ft = attach_ft(self)  # torchft replica groups (train/ft.py), when launched so

    # --- setup helpers -----------------------------------------------------------------

    def _load_data(self) -> DataBundle:
        # Rank 0 downloads (where allowed) while the others wait, then everyone reads. A bad
        # dataset on rank 0 reaches every rank as the same one line: the others never die
        # in a barrier whose peer left (with a second traceback).
        box: list[str | None] = [None]
        if self.world.is_main:
            try:
                data = self._build_data(rank0_download=True)
            except ConfigError as e:
                box[0] = str(e)
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            raise ConfigError(box[0])
        if not self.world.is_main:
            data = self._build_data(rank0_download=False)
        return data

    def _build_data(self, rank0_download: bool) -> DataBundle:
        spec = resolve.dataset_spec(self.cfg)
        return spec.build(self.cfg, rank0_download, self.spec.data_kind)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        cfg, params = self.cfg, self.model.parameters()
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def _autocast(self) -> contextlib.AbstractContextManager:
        # FSDP2 casts parameters itself (MixedPrecisionPolicy); DDP needs autocast.
        if self.cfg.mixed_precision in DTYPES and self.cfg.parallel == "ddp":
            return torch.autocast(self.world.device.type, dtype=DTYPES[self.cfg.mixed_precision])
        return contextlib.nullcontext()

    def _batches(self):
        """Micro-batches forever, epoch after epoch, from the sampler's current position."""
        return iterate_batches(
            self.data.train, self.sampler, self.world.device, self.cfg.num_workers, self.world.rank
        )

    def _train_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": self.world.size,
            "global_batch": self.global_batch,
            "peak_lr": self.peak_lr,
            # NaN for "none yet": DCP stores plain values, and the run's first loss must
            # survive a restart (summary.json reports it).
            "first_loss": float("nan") if self.first_loss is None else self.first_loss,
        }

    def _ckpt_info(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "step": self.step,
            "world_size": self.world.size,
            "parallel": c.parallel,
            "sharding": c.sharding,
            "model": c.model,
            "optimizer": c.optimizer,
            "global_batch": self.global_batch,
            "epoch": self.sampler.epoch,
            "consumed": self.sampler.consumed,
            # what the epoch's order depends on: a resume that changes them is told so
            "seed": c.seed,
            "samples": self.sampler.n,
        }

    # --- the loop ----------------------------------------------------------------------

    def train(self) -> int:
        try:
            return self._train()
        except Diverged as e:
            return self.diverged(e)
        finally:
            self.release_locks()

    def release_locks(self) -> None:
        for lock in reversed(self.locks):
            lock.release()

    def world_line(self) -> str:
        """The run's first log line: the world it trains in (a pod's or a node's log shows it)."""
        w, cfg = self.world, self.cfg
        how = "DDP" if cfg.parallel == "ddp" else f"FSDP2 {cfg.sharding}"
        return (
            f"world: {w.size} rank{'s' if w.size != 1 else ''} ({w.nnodes} node{'s' if w.nnodes != 1 else ''} x "
            f"{w.local_size} process{'es' if w.local_size != 1 else ''}), backend {w.backend} "
            f"on {w.device.type}, {how}; model {cfg.model} ({self.num_params:,} parameters), "
            f"global batch {self.global_batch}, {self.total_steps} steps"
        )

    def _train(self) -> int:
        self.reporter.info(self.world_line())
        if self.ft:
            self.reporter.info(self.ft.line())
        # its collectives (on the checkpoint's group) are diagnosed as a step's
        self.guarded(self.maybe_resume, when="at start-up")
        self.phase = "stop-signal all_reduce"
        # one that came during start-up
        signum = self.guarded(self.stop.agree_now, self.control_pg, when="at start-up")
        if signum and self.step < self.total_steps:
            return self.preempted(signum)
        batches = self.ft.batches() if self.ft else self._batches()
        timer_t, timer_step = time.perf_counter(), self.step
        while self.step < self.total_steps:
            if self.fault:
                self.fault.maybe_fire(self.step + 1, self.world.rank)
            self.profiler.before(self.step + 1)
            started = time.perf_counter()
            loss, gnorm = self.guarded(self.train_step, batches)
            if self.pace_s:
                pace(started, self.pace_s)
            if self.ft and not self.ft.committed:
                continue  # not applied on this group: the same step again (train/ft.py)
            self.step += 1
            self.profiler.after(self.step)
            self.reporter.tick(self.step)
            if self.time_to_first_step is None:
                self.time_to_first_step = time.perf_counter() - self.t_start
            if self.step % self.cfg.log_interval == 0 or self.step in (1, self.total_steps):
                now = time.perf_counter()
                # Every collective of the loop is guarded: a rank stopped at a logging step
                # is named in one line there too, not in a gloo timeout's traceback.
                here = f"at step {self.step}"
                step_time = (now - timer_t) / max(1, self.step - timer_step)
                if self.fault:
                    self.fault.at_logging(self.step, self.world.rank)
                self.guarded(self.log_step, loss, gnorm, step_time, when=here)
                timer_t, timer_step = time.perf_counter(), self.step
            if self.cfg.eval_interval and self.step % self.cfg.eval_interval == 0:
                self.end_log()  # the step's line first
                self.log_eval(self.guarded(self.evaluate, True, when=f"at step {self.step}"))
            # A save's collectives (and an async one's, finished here) fail within
            # --timeout-s when a rank stops mid-save, diagnosed as a training step's are.
            if self.ckpt.in_flight is not None:
                self.guarded(self.end_async_save, False, when=f"at step {self.step}")
            if self.cfg.ckpt_interval and self.step % self.cfg.ckpt_interval == 0:
                self.guarded(self.save, when=f"at step {self.step}")
            if self.step % self.stop_every == 0:
                self.phase = "stop-signal all_reduce"
                signum = self.guarded(
                    self.stop.agreed, self.control_pg, when=f"at step {self.step}"
                )
                if signum and self.step < self.total_steps:
                    return self.preempted(signum)
        # A signal in the last steps, not yet delivered by the pipelined check: the run is
        # finished anyway; finish() says so (summary "signal") instead of ignoring it.
        if self.fault:
            self.fault.maybe_fire(Fault.END, self.world.rank)
        return self.guarded(self._end, when=f"after the last step ({self.step})")

    def _end(self) -> int:
        self.end_log()
        self.phase = "stop-signal all_reduce"
        self.late_signal = self.stop.agree_now(self.control_pg)
        if self.cfg.ckpt_final and self.last_saved != self.step:
            self.save(force_sync=True)
        self.ckpt.close()
        return self.finish()

    def train_step(self, batches) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg, model, opt = self.cfg, self.model, self.optimizer
        opt.zero_grad(set_to_none=True)  # first: under torchft the quorum may heal the step
        lr = self.peak_lr * lr_multiplier(
            self.step, cfg.warmup_steps, self.total_steps, cfg.lr_decay, cfg.min_lr_ratio
        )
        for g in opt.param_groups:
            g["lr"] = lr
        poison = self.fault is not None and self.fault.poisons(self.step + 1, self.world.rank)
        # Every op counts on a small model's step (a few ms on a CPU): with one micro-batch
        # there is nothing to sum, scale or toggle.
        accum = cfg.grad_accum
        loss_sum = torch.zeros((), device=self.world.device) if accum > 1 else None
        self.phase = self.fwd_bwd_phase
        for micro in range(accum):
            x, y = next(batches)
            if self.pending_log is not None:  # the last logging step's, overlapped so far
                self.end_log()
                self.phase = self.fwd_bwd_phase
            self.sampler.advance()
            if accum > 1:
                set_grad_sync(model, micro == accum - 1)
            with self._autocast():
                out = model(x)
                loss = self.loss_fn(out, y)
                if accum > 1:
                    loss = loss / accum
            if poison:  # test hook (DDPKIT_FAULT=nan@STEP:RANK)
                loss = loss * float("nan")
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            if loss_sum is None:
                loss_sum = loss.detach()
            else:
                loss_sum += loss.detach()
        assert loss_sum is not None  # grad_accum >= 1 (TrainConfig)
        if self.ft:
            self.ft.average_gradients()
        if self.scaler:
            self.scaler.unscale_(opt)
        gnorm = None
        logging_now = (self.step + 1) % cfg.log_interval == 0 or self.step + 1 in (
            1,
            self.total_steps,
        )
        if cfg.clip_grad:
            self.phase = "grad-norm all_reduce"  # a collective under FSDP (DTensor grads)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        elif logging_now:  # measure only: no pass over the gradients to scale them by 1
            self.phase = "grad-norm all_reduce"
            gnorm = total_norm([p.grad for p in model.parameters() if p.grad is not None])
        # fp16: the grad scaler skips steps with inf gradients by design; only the loss counts.
        checked = None if self.scaler else gnorm
        if cfg.max_bad_steps:
            if not self.health.step_ok(self.step + 1, Health.finite(loss_sum, checked)):
                opt.zero_grad(set_to_none=True)
                self.reporter.info(
                    f"warning: step {self.step + 1}: non-finite loss or gradient norm, "
                    f"skipped ({self.health.skipped} of --max-bad-steps {cfg.max_bad_steps})"
                )
                return loss_sum, gnorm
        else:
            self.health.observe(self.step + 1, loss_sum, checked)
        self.phase = "optimizer step"
        self.ckpt.wait_staging()
        if self.scaler:
            self.scaler.step(opt)
            self.scaler.update()
        else:
            opt.step()
        return loss_sum, gnorm

    def guarded(self, fn, *args, when: str | None = None):
        """Run a step (or the start or end of the run: `when` says which); turn a failed or
        timed-out collective into one clear message naming the phase and the missing ranks."""
        try:
            return fn(*args)
        except CollectiveFailure:
            raise  # diagnosed already (a guarded barrier inside)
        except (RuntimeError, dist.DistError) as e:
            if not is_collective_error(e):
                raise
            raise CollectiveFailure(
                diagnose_collective_failure(
                    self.phase, self.step + 1, self.cfg.timeout_s, e, when=when
                )
            ) from None

    def barrier(self, phase: str, when: str) -> None:
        self.phase = phase
        self.guarded(dist.barrier, when=when)

    # --- checkpoints and resume (the ends of a run: ending.py) ----------------------------

    def end_async_save(self, block: bool) -> None:
        """The async save in flight, if any: marked complete once done (block: waited for),
        its collectives' failure named as that save's."""
        if self.ckpt.in_flight is not None:
            self.phase = f"async checkpoint save of step {self.ckpt.in_flight}"
            if block:
                self.ckpt.wait()
            else:
                self.ckpt.poll()

    def save(self, force_sync: bool = False) -> float:
        self.end_log()  # its divergence check, and first_loss for the train state
        self.end_async_save(block=True)  # one save at a time: the last one ends first
        self.phase = "checkpoint save"
        self.health.check()  # never save (nor prune for) a non-finite state
        self.last_saved = self.step
        return self.ckpt.save(self.step, self.states, self._ckpt_info(), force_sync=force_sync)

    def maybe_resume(self) -> None:
        self.phase = "checkpoint load"
        states = dict(self.states)
        if self.cfg.reset_optimizer:  # the optimizer keeps its fresh state
            del states["optim"]
        got = self.ckpt.resume(self.cfg.resume, states)
        if got is None:
            return
        if self.cfg.reset_optimizer:
            self.reporter.info("--reset-optimizer: the optimizer state starts fresh")
        path, info = got
        state = self._resumed
        self.step = int(state["step"])
        first = float(state.get("first_loss", float("nan")))
        self.first_loss = None if first != first else first
        if self.ckpt.holds(path):
            self.last_saved = self.step  # else the final save re-writes it here, resharded
        self.resumed_from = str(path)
        old_world, old_gb = int(state["world_size"]), int(state["global_batch"])
        msg = (
            f"resumed from {path} at step {self.step} (epoch {self.sampler.epoch}, "
            f"{self.sampler.consumed} samples into it)"
        )
        if old_world != self.world.size or old_gb != self.global_batch:
            # Rule: the per-rank batch is what the user set, so the global batch follows the
            # world size; the peak LR is re-derived from it by --lr-scaling (unchanged for
            # none); step count and data position carry over sample-exactly.
            msg += (
                f"; world size {old_world} -> {self.world.size}: global batch "
                f"{old_gb} -> {self.global_batch}, peak lr {float(state['peak_lr']):.3e} -> "
                f"{self.peak_lr:.3e} (--lr-scaling {self.cfg.lr_scaling})"
            )
        self.reporter.info(msg)
        warning = self._order_change(info)
        if warning:
            self.reporter.info(f"warning: {warning}")
        self._settle_ddp_buckets()

    def _order_change(self, info: dict[str, Any]) -> str | None:
        """What breaks exactly-once when a resume changes the epoch's order: another --seed
        or a dataset of another size, mid-epoch (checkpoints without the fields: nothing)."""
        seed, samples = info.get("seed"), info.get("samples")
        s = self.sampler
        changes = []
        if seed is not None and seed != self.cfg.seed:
            changes.append(f"--seed {self.cfg.seed} (the checkpoint's: {seed})")
        if samples is not None and samples != s.n:
            changes.append(f"{s.n} training samples (the checkpoint's: {samples})")
        if not changes or s.consumed == 0:
            return None  # at an epoch boundary: the next epoch is a new order anyway
        return (
            f"resumed with {' and '.join(changes)} in the middle of epoch {s.epoch}: the rest "
            f"of that epoch ({s.n - s.consumed} samples) is drawn in another order, so some of "
            "its samples repeat and others are skipped (exactly-once holds again from the next "
            "epoch); resume with the checkpoint's values to keep it"
        )

    def _settle_ddp_buckets(self) -> None:
        """Make a resumed DDP run add gradients in the same order as an uninterrupted one.

        DDP lays out its gradient buckets in parameter order for the first backward and in
        gradient-ready order from the second on. With more than two ranks, the bucket layout
        decides the order in which the all-reduce adds ranks' values, so a resumed run's
        first step would round differently. Two discarded forward/backward passes here (no optimizer
        step, RNG restored) puts the buckets where the uninterrupted run has them.
        """
        if self.cfg.parallel != "ddp" or self.world.size <= 2 or self.ft:
            return  # (torchft's groups keep DDP's first layout: train/parallel.py apply_ddp)
        rng = torch.get_rng_state()
        x, y = next(self._batches())
        for _ in range(2):  # DDP rebuilds its buckets at the start of the second forward
            with self._autocast():
                self.loss_fn(self.model(x), y).backward()
        self.optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)

    # --- evaluation ----------------------------------------------------------------------

    def log_eval(self, ev: dict[str, float]) -> None:
        if ev:
            self.reporter.log_eval(
                {"step": self.step, **ev, "time_s": time.perf_counter() - self.t_start}
            )

    def evaluate(self, force: bool = False) -> dict[str, float]:
        """Held-out loss/accuracy; collective (every rank calls it). force: despite --no-eval."""
        if not (self.cfg.eval or force):
            return {}
        self.phase = "evaluation all_reduce"
        return held_out(
            self.model, self.data.val, self.loss_fn, self.cfg, self.world, self._autocast
        )
