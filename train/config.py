"""One typed training config: defaults < TOML file (--config) < command line.

Every field is one flag (`--batch-size` for `batch_size`) and one TOML key (a file may put
them at the top level or under a `[train]` table, so a launcher job file can carry them).
Validation raises ConfigError with the problem and the fix; `python -m ddpkit.train` turns that
into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from ddpkit.train import dataclass_fields, resolve
from ddpkit.train.contract import (
    EXIT_BAD_INPUT,
    EXIT_REQUEUE,
    default_ckpt_dir,
    default_run_dir,
    is_remote,
)
from ddpkit.train.errors import CliParser, ConfigError, valid_keys
from ddpkit.train.ft_env import group_dirs
from ddpkit.train.preflight import check_packages, check_world, world_from_env


@dataclass
class TrainConfig:
    # --- what to train ---
    # Unset, the entry point's name ("train" for python -m ddpkit.train, a fit() script's
    # file name): two programs never share (and resume) one run dir by default.
    name: str = ""  # run name; the run dir defaults to runs/<name>
    # model/dataset/loss: a built-in name, an import path pkg.module:attr or hf:PATH (the
    # contracts: train/registry.py and the README's "Your own model")
    model: str = (
        "mlp"  # mlp (784-256-10), mlp-deep (8x2048), resnet18, gpt, pkg.mod:factory, hf:DIR
    )
    dataset: str = "synthetic"  # synthetic (from the seed), mnist, cifar10, imagefolder, tokens (uint16/uint32 id file), pkg.mod:build_dataset, hf:FILES
    loss: str | None = None  # cross_entropy or pkg.mod:loss; unset: the model's (cross_entropy)
    model_args: dict[str, Any] = field(
        default_factory=dict
    )  # keywords for a model factory: JSON, or [train.model_args] in TOML
    dataset_args: dict[str, Any] = field(
        default_factory=dict
    )  # keywords for a dataset factory: JSON, or [train.dataset_args] in TOML
    data_dir: str = "data"  # where mnist/cifar10/imagefolder/tokens files live
    download: bool = True  # let torchvision download mnist/cifar10 when the network allows
    synthetic_samples: int = (
        8192  # size of the synthetic training set (a held-out set is 1/8 of it)
    )
    synthetic_classes: int = 10  # classes of the synthetic classification set
    # gpt shape (ignored by other models)
    seq_len: int = 128  # gpt: tokens per sample (context length)
    # Unset: an hf:DIR model's own vocabulary (its config.json), else DEFAULT_VOCAB.
    vocab_size: int | None = None  # gpt and synthetic tokens: token ids are < vocab_size
    n_layer: int = 4  # gpt: transformer blocks
    n_head: int = 4  # gpt: attention heads (must divide d_model)
    d_model: int = 128  # gpt: hidden width
    dropout: float = 0.0  # gpt: dropout probability
    # --- parallelism ---
    parallel: Literal["ddp", "fsdp"] = "ddp"  # ddp: full replicas; fsdp: FSDP2 sharding
    sharding: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] | None = (
        None  # fsdp only; default FULL_SHARD
    )
    replicate_degree: int | None = None  # HYBRID_SHARD: replicas; default = number of nodes
    mixed_precision: Literal["none", "bf16", "fp16"] = "none"  # low-precision compute
    # --- optimisation ---
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"  # sgd uses momentum 0.9
    batch_size: int = 64  # per rank, per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    steps: int | None = None  # optimizer steps; wins over epochs (0: unset, train by epochs)
    epochs: int | None = None  # full passes over the data (used when steps is unset)
    lr: float = 1e-3  # base LR, at base_batch_size when lr_scaling is not none
    weight_decay: float = 0.0  # decoupled for adamw, L2 for adam and sgd
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # peak lr x (global/base batch)
    base_batch_size: int | None = None  # global batch the base LR was tuned for
    warmup_steps: int = 0  # linear LR warmup from 0
    lr_decay: Literal["constant", "cosine"] = "constant"  # LR after warmup
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    clip_grad: float | None = None  # max global grad norm; unset = no clipping
    seed: int = 0  # same initial weights on every rank; data order
    # --- data loading, logging, outputs ---
    num_workers: int = 0  # DataLoader worker processes per rank
    log_interval: int = 10  # steps between metric lines
    eval: bool = True  # evaluate on the held-out split at the end
    run_dir: str | None = None  # default runs/<name>
    tensorboard: bool = False  # same as --log-to tensorboard
    progress: Literal["auto", "bar", "plain"] = "auto"  # auto: a bar on a terminal
    log_to: str = ""  # comma list of tensorboard, wandb, mlflow (rank 0; package needed)
    eval_interval: int = 0  # steps between held-out evaluations; 0 = only at the end
    # Each eval batch is training's micro-batch (--batch-size per rank), so eval fits where
    # training does.
    eval_steps: int = 50  # batches per evaluation; 0 = the whole held-out split
    profile_steps: str | None = None  # A-B: torch.profiler trace of steps A..B in the run dir
    # --- checkpoints and fault tolerance ---
    ckpt_dir: str | None = None  # default <run_dir>/checkpoints
    ckpt_interval: int = 0  # steps between checkpoints; 0 = only at the end and on signals
    ckpt_keep: int = 3  # keep the newest K complete checkpoints
    ckpt_async: bool = False  # dcp.async_save: training continues while it writes
    ckpt_final: bool = True  # save a checkpoint when training ends
    resume: str = "auto"  # auto | never | PATH to a step-N checkpoint directory
    timeout_s: float = 600.0  # a collective that waits longer fails the job
    shutdown_timeout_s: float = 30.0  # torchrun's --shutdown-timeout: a signal save must fit in it
    reset_optimizer: bool = False  # resume without the optimizer state (e.g. after changing it)
    max_bad_steps: int = 0  # skip up to N non-finite steps before stopping (syncs every step)
    stop_check_s: float = 0.25  # seconds between the ranks' stop-signal agreements (0: every step)
    # --- CUDA path ---
    compile: bool = False  # torch.compile each block
    activation_checkpointing: bool = False  # recompute each block in backward
    peak_tflops: float | None = None  # for MFU; default from the device table
    extra: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}

    def __post_init__(self) -> None:
        if self.vocab_size is None:  # resolved once, however the config was made
            self.vocab_size = model_vocab(self.model) or DEFAULT_VOCAB


# --log-to name -> the package it needs: checked on the node before the run writes anything
# (ddpkit.train.metrics imports it on rank 0 only, and only when chosen).
LOG_BACKENDS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}

# Keys a TOML file or a job file's [train] table may set (one per flag).
TRAIN_KEYS = [f.name for f in fields(TrainConfig) if f.name != "extra"]


# --- parsing -------------------------------------------------------------------------------


_flag = dataclass_fields.flag  # the one spelling of a field as a flag


def _hints() -> dict[str, Any]:
    return get_type_hints(TrainConfig)


def convert_value(name: str, value: Any, where: str) -> Any:
    """Check a TOML (or fit()) value against the field's type with the one typed engine
    (ddpkit.train.dataclass_fields; the CLI path is checked by argparse). None stays None (fit()'s
    "unset")."""
    if value is None:
        return None
    return dataclass_fields.check_value(_hints()[name], value, f"{where}: {name}", ConfigError)


def field_help() -> dict[str, str]:
    """Each TrainConfig field's help text: its trailing comment in the source."""
    return dataclass_fields.field_comments(TrainConfig)


class _Parser(CliParser):
    error_class = ConfigError


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ddpkit.train",
        description="ddpkit training: DDP or FSDP2 under torchrun (or a single process).",
    )
    p.add_argument("--config", help="TOML file with the same keys (top level or [train])")
    p.add_argument("--print-config", action="store_true", help="print the resolved config, exit")
    dataclass_fields.add_arguments(p, TrainConfig)
    return p


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; ConfigError naming the file when missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file; pass an existing TOML file")
    try:
        # utf-8-sig: a byte-order mark (what some Windows editors write) is read as nothing
        return tomllib.loads(p.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"--config {path}: not UTF-8 text (byte {e.start}); save the file as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML ({e}); fix the syntax") from None


def load_toml(path: str) -> dict[str, Any]:
    data = read_toml(path)
    # A launcher job file (configs/*.toml) keeps the training keys under [train] beside
    # [slurm], [k8s], ... sections; a plain training file has them at the top level.
    if isinstance(data.get("train"), dict):
        table = dict(data["train"])
        if "name" in data and "name" not in table:
            table["name"] = data["name"]
    else:
        table = data
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in TRAIN_KEYS:
            raise ConfigError(
                f"--config {path}: unknown key {key!r}; {valid_keys(name, sorted(TRAIN_KEYS))}"
            )
        out[name] = convert_value(name, value, f"--config {path}")
    return out


def parse_config(
    argv: list[str] | None = None,
    defaults: dict[str, Any] | None = None,
    world: tuple[int, int] | None = None,
    installed: bool = True,
    local_paths: bool = True,
) -> tuple[TrainConfig, bool]:
    """Resolve defaults < (a script's `defaults`, see train.fit) < --config file < flags.
    Returns (config, print_only).

    `world` = (world size, nodes) the run will have; default: torchrun's environment. The
    launchers (ddpkit.train.node, ddpkit.tools.submit) pass it to check a launch before it starts.
    installed=False skips the checks of what is installed (ddpkit.tools.submit renders for nodes
    whose packages it cannot see); local_paths=False also skips whether input paths
    (--data-dir, --resume, hf:PATH) exist here (a container's paths exist only in its
    image or volumes)."""
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    for key, value in (defaults or {}).items():
        if key not in TRAIN_KEYS:
            raise ConfigError(f"fit(): unknown setting {key!r}; {valid_keys(key, TRAIN_KEYS)}")
        values[key] = convert_value(key, value, "fit()")
    if args.config:
        values.update(load_toml(args.config))
    for f in fields(TrainConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    # steps wins over epochs at the same level; a level above (the command line over the
    # file) decides on its own: --epochs alone switches a job file's steps off, and
    # --steps 0 means "no step count: train for the epochs".
    if args.epochs is not None and args.steps is None:
        values["steps"] = None
    if values.get("steps") == 0:
        values["steps"] = None
    cfg = TrainConfig(**values)
    validate(cfg, local_paths=local_paths)
    if installed:  # not in validate(): what is installed is the node's business
        check_packages(log_packages(cfg))
    if world is None:
        _, size, _, local_size = world_from_env()
        world = (size, max(1, size // max(1, local_size)))
    check_world(cfg.sharding, cfg.replicate_degree, *world)
    return cfg, bool(args.print_config)


SEED_MAX = 2**63 - 1  # torch.manual_seed takes a signed 64-bit seed

# Closed intervals a number field must lie in, beyond being finite (lo, hi; None = open).
_RANGES: dict[str, tuple[float | None, float | None, str]] = {
    "weight_decay": (0.0, None, ">= 0"),
    "min_lr_ratio": (0.0, 1.0, "in [0, 1] (a fraction of --lr)"),
    "shutdown_timeout_s": (1e-9, None, "> 0 seconds"),
    "stop_check_s": (0.0, None, ">= 0 seconds (0: every step)"),
    "peak_tflops": (1e-9, None, "> 0"),
    "dropout": (0.0, 0.999999, "in [0, 1)"),
    "seed": (0, SEED_MAX, f"in 0..{SEED_MAX} (2**63-1)"),
}
# Durations in seconds have a ceiling too: a collective timeout of 1e30 s overflows
# datetime.timedelta deep in init_process_group, after the run dir was written. A week is
# longer than any wait a job means, and far inside what timedelta and torchrun accept.
DURATION_MAX_S = 7 * 24 * 3600
_DURATIONS = ("timeout_s", "shutdown_timeout_s", "stop_check_s")
_POSITIVE_SHAPE = ("synthetic_samples", "synthetic_classes", "seq_len", "vocab_size", "n_layer")
_POSITIVE_SHAPE += ("n_head", "d_model")


DEFAULT_VOCAB = 512


def model_vocab(model: str) -> int | None:
    """The vocabulary of an hf:DIR model, read from its config.json (no transformers import);
    None for other models or when the file is not there (the model's own check says so)."""
    if not model.startswith("hf:"):
        return None
    path = Path(model[3:]) / "config.json"
    try:
        value = json.loads(path.read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"--model {model}: config.json's vocab_size is {value!r}, not a positive integer; "
            "fix the model's config.json"
        )
    return value


def check_numbers(cfg: TrainConfig) -> None:
    """Numbers that no flag may take: NaN/inf anywhere, booleans for numbers (a TOML
    `batch_size = true` or a Python caller), values outside a field's range, empty paths."""
    hints = _hints()
    for f in fields(TrainConfig):
        v = getattr(cfg, f.name)
        tp, choices = dataclass_fields.base_type(hints[f.name])
        if v is None or choices is not None or tp not in (int, float):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{_flag(f.name)} must be a number, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{_flag(f.name)} must be a finite number, got {v}")
        if f.name in _RANGES:
            lo, hi, text = _RANGES[f.name]
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise ConfigError(f"{_flag(f.name)} must be {text}, got {v}")
        if f.name in _DURATIONS and v > DURATION_MAX_S:
            raise ConfigError(
                f"{_flag(f.name)} must be at most {DURATION_MAX_S} seconds (one week), got {v}"
            )
        if isinstance(v, int) and abs(v) > SEED_MAX:  # torch's int64: steps, sizes, counts
            raise ConfigError(f"{_flag(f.name)} must be at most {SEED_MAX} (2**63-1), got {v}")
    for name in _POSITIVE_SHAPE:
        if getattr(cfg, name) < 1:
            raise ConfigError(
                f"{_flag(name)} must be >= 1, got {getattr(cfg, name)}; pass a positive integer"
            )
    for name in ("run_dir", "ckpt_dir", "data_dir"):
        v = getattr(cfg, name)
        if v is not None and not isinstance(v, str):  # argparse drops a value that is exactly "--"
            raise ConfigError(f"{_flag(name)} '--' cannot reach the trainer as a value; use ./--")
        if v is not None and not str(v).strip():
            raise ConfigError(
                f"{_flag(name)} is empty; pass a name or path (it would write into the "
                "current directory)"
            )


def validate(cfg: TrainConfig, local_paths: bool = True) -> None:
    """Checks that need no process group. World-size checks live in ddpkit.train.parallel.
    local_paths=False: input paths are not looked up on this machine (see parse_config)."""
    check_numbers(cfg)

    def positive(name: str, allow_none: bool = False) -> None:
        v = getattr(cfg, name)
        if v is None and allow_none:
            return
        if v is None or v < 1:
            raise ConfigError(f"{_flag(name)} must be >= 1, got {v}; pass a positive integer")

    positive("batch_size")
    positive("grad_accum")
    positive("log_interval")
    positive("steps", allow_none=True)
    positive("epochs", allow_none=True)
    positive("base_batch_size", allow_none=True)
    positive("replicate_degree", allow_none=True)
    positive("ckpt_keep")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {cfg.lr}")
    if cfg.max_bad_steps < 0:
        raise ConfigError(f"--max-bad-steps must be >= 0, got {cfg.max_bad_steps}")
    if cfg.warmup_steps < 0 or cfg.ckpt_interval < 0 or cfg.num_workers < 0:
        raise ConfigError("--warmup-steps, --ckpt-interval and --num-workers must be >= 0")
    if cfg.timeout_s <= 0:
        raise ConfigError(f"--timeout-s must be > 0 seconds, got {cfg.timeout_s}")
    if cfg.clip_grad is not None and cfg.clip_grad <= 0:
        raise ConfigError(f"--clip-grad must be > 0, got {cfg.clip_grad}; omit it to not clip")
    if cfg.parallel == "ddp" and cfg.sharding is not None:
        raise ConfigError(
            f"--sharding {cfg.sharding} needs --parallel fsdp (DDP does not shard); "
            "add --parallel fsdp or drop --sharding"
        )
    if cfg.replicate_degree is not None and cfg.sharding != "HYBRID_SHARD":
        raise ConfigError(
            "--replicate-degree only applies to --sharding HYBRID_SHARD; drop it or add "
            "--parallel fsdp --sharding HYBRID_SHARD"
        )
    if cfg.parallel == "fsdp" and cfg.sharding is None:
        cfg.sharding = "FULL_SHARD"
    if cfg.lr_scaling != "none" and cfg.base_batch_size is None:
        raise ConfigError(
            f"--lr-scaling {cfg.lr_scaling} needs --base-batch-size (the global batch "
            "the base --lr was tuned for)"
        )
    resolve.check_names(cfg, local_paths=local_paths)
    mkind, dkind = resolve.model_kind(cfg), resolve.dataset_kind(cfg)
    if mkind is not None and dkind != "any" and mkind != dkind:
        raise ConfigError(
            f"--model {cfg.model} trains on {mkind} data, --dataset {cfg.dataset} holds {dkind}; "
            f"pick a dataset of {mkind} (synthetic fits every model)"
        )
    resolve.check_model(cfg)
    if local_paths and cfg.dataset in ("imagefolder", "tokens") and not Path(cfg.data_dir).exists():
        raise ConfigError(
            f"--data-dir {cfg.data_dir} does not exist; point it at your {cfg.dataset} data"
        )
    if (
        local_paths
        and cfg.dataset in ("mnist", "cifar10")
        and not cfg.download
        and not Path(cfg.data_dir).is_dir()
    ):
        raise ConfigError(
            f"--data-dir {cfg.data_dir} does not exist and --no-download is set: put the "
            f"{cfg.dataset} files there, or allow the download"
        )
    resume = cfg.resume not in ("auto", "never") and not is_remote(cfg.resume)  # a store's: later
    if local_paths and resume and not Path(cfg.resume).exists():
        raise ConfigError(
            f"--resume {cfg.resume}: no such checkpoint directory; pass a step-N directory "
            "under the checkpoint dir, or auto / never"
        )
    check_outputs(cfg)
    if not cfg.name.strip():
        cfg.name = entry_name()
    replica_group_dirs(cfg)
    if cfg.run_dir is None:
        cfg.run_dir = default_run_dir(cfg.name)
    if cfg.ckpt_dir is None:
        cfg.ckpt_dir = default_ckpt_dir(cfg.run_dir)


def replica_group_dirs(cfg: TrainConfig, env: dict[str, str] | None = None) -> None:
    """A torchft replica group writes into its group's own dirs (the supervisor's
    <run dir>/group-<g> and <ckpt dir>/group-<g>, ft_env.group_dirs), whatever run and
    checkpoint dirs its flags name: those are the job's, the same for every group. Without it
    the groups took the same dirs, and all but the first found them locked."""
    dirs = group_dirs(env)
    if dirs is not None:
        cfg.run_dir, cfg.ckpt_dir = dirs


def entry_name(argv0: str | None = None) -> str:
    """The run name of an unnamed run: the running program's ("train" for the kit's trainer,
    "fit_script" for examples/fit_script.py)."""
    path = Path(sys.argv[0] if argv0 is None else argv0)
    if path.name == "__main__.py":  # python -m PKG: the package's name (ddpkit.train: train)
        return path.parent.name or "train"
    return "train" if path.stem in ("", "-c") else path.stem


def log_backends(cfg: TrainConfig) -> list[str]:
    """The chosen logging backends: --log-to's list, plus tensorboard for --tensorboard."""
    names = [n.strip() for n in cfg.log_to.split(",") if n.strip()]
    if cfg.tensorboard:
        names.insert(0, "tensorboard")
    return list(dict.fromkeys(names))


def log_packages(cfg: TrainConfig) -> dict[str, str]:
    """The package each chosen logging backend needs, by the flag that chose it."""
    needs = {}
    for name in log_backends(cfg):
        flag = "--tensorboard" if name == "tensorboard" and cfg.tensorboard else f"--log-to {name}"
        needs[flag] = LOG_BACKENDS[name]
    return needs


def profile_range(spec: str | None) -> tuple[int, int] | None:
    """--profile-steps A-B (or just A) as (A, B), 1 <= A <= B; None when unset."""
    if not spec:
        return None
    a, _, b = spec.partition("-")
    if not (a.strip().isdigit() and (not b or b.strip().isdigit())):
        raise ConfigError(
            f"--profile-steps {spec!r}: write A-B (first and last step to trace), e.g. 10-12"
        )
    lo, hi = int(a), int(b or a)
    if not 1 <= lo <= hi:
        raise ConfigError(f"--profile-steps {spec}: need 1 <= A <= B, got A={lo} B={hi}")
    return lo, hi


def check_outputs(cfg: TrainConfig) -> None:
    """--log-to, --eval-interval and --profile-steps values (no package lookups here)."""
    unknown = [n for n in log_backends(cfg) if n not in LOG_BACKENDS]
    if unknown:
        raise ConfigError(
            f"--log-to {cfg.log_to}: unknown {', '.join(unknown)}; pick from "
            f"{', '.join(LOG_BACKENDS)} (comma-separated)"
        )
    if cfg.eval_steps < 0:
        raise ConfigError(f"--eval-steps must be >= 0 (0 = the whole split), got {cfg.eval_steps}")
    if cfg.eval_interval < 0:
        raise ConfigError(
            f"--eval-interval must be >= 0 steps (0 = at the end), got {cfg.eval_interval}"
        )
    profile_range(cfg.profile_steps)


def dump(cfg: TrainConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=False)


__all__ = [
    "ConfigError",
    "EXIT_BAD_INPUT",
    "EXIT_REQUEUE",
    "TRAIN_KEYS",
    "TrainConfig",
    "dump",
    "parse_config",
    "validate",
]
