"""The job spec every backend renders from: one TOML file (configs/*.toml) plus overrides.

Precedence, stated once: dataclass defaults < the TOML file < `--set key=value` (dotted keys
of the file, e.g. `slurm.partition=gpu`, `train.lr=3e-4`) < `--nodes` / `--gpus`.
`[train]` holds the training flags (ddpkit.train.config.TrainConfig's fields); an engine's
table (`[slurm]`, `[k8s]`, `[docker]`, a plugin's `[mine]`) holds what only that engine has: its
Backend.Options dataclass types it (the engine's package owns it; the registry,
tools/backends/registry.py, names the engines), and the engine checks it (Backend.validate),
never another's rules.

Modules, imported downward only: values.py (pure helpers) <- schema.py (JobSpec, validators
declared on its fields) <- load.py (the job file, overrides, validation, the workspace), and
schema.py <- command.py (the command every node runs: node_command, the one builder every
engine calls). The names below are the package's interface.
"""

from ddpkit.tools.jobspec.command import node_command, standalone
from ddpkit.tools.jobspec.load import (
    BUILTIN_JOB,
    JOB_FILE,
    apply_override,
    builtin_job_path,
    default_job_file,
    in_workspace,
    load_spec,
    parse_override_value,
    resolve_workspace,
    validate,
)
from ddpkit.tools.jobspec.schema import (
    ENTRY_NEUTRAL_TRAIN_KEYS,
    ENV_NAME_RE,
    MAX_SHUTDOWN_S,
    MEM_RE,
    MODULE_RE,
    NAME_CHECK,
    NAME_RE,
    JobSpec,
    SpecError,
)
from ddpkit.tools.jobspec.values import DebugPreset, debug_env, flag_value, parse_time_minutes

__all__ = [
    "BUILTIN_JOB",
    "ENTRY_NEUTRAL_TRAIN_KEYS",
    "ENV_NAME_RE",
    "JOB_FILE",
    "MAX_SHUTDOWN_S",
    "MEM_RE",
    "MODULE_RE",
    "NAME_CHECK",
    "NAME_RE",
    "DebugPreset",
    "JobSpec",
    "SpecError",
    "apply_override",
    "builtin_job_path",
    "debug_env",
    "default_job_file",
    "flag_value",
    "in_workspace",
    "load_spec",
    "node_command",
    "parse_override_value",
    "parse_time_minutes",
    "resolve_workspace",
    "standalone",
    "validate",
]
