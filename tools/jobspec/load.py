"""Loading a job: the job file's typed tables, `--set` overrides, validation, the workspace.

Precedence, stated once: dataclass defaults < the TOML file < `--set key=value` (dotted keys
of the file, e.g. `slurm.partition=gpu`, `train.lr=3e-4`) < `--nodes` / `--gpus`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from ddpkit.tools.jobspec.schema import (
    ENTRY_NEUTRAL_TRAIN_KEYS,
    MAX_SHUTDOWN_S,
    MODULE_RE,
    JobSpec,
    SpecError,
)
from ddpkit.train import dataclass_fields
from ddpkit.train.config import TRAIN_KEYS, ConfigError, TrainConfig, parse_config, read_toml
from ddpkit.train.config import convert_value as _convert_train_value
from ddpkit.train.errors import valid_keys

# --- typed loading -------------------------------------------------------------------------


# Every count, port, limit and duration of a job is stored by a scheduler as a signed 32-bit
# integer (SLURM, Kubernetes, torchrun's flags): a job's integer outside it is refused here,
# in one line, for every table (plugins' too), not in a traceback or a scheduler's reject.
INT_MAX = 2**31 - 1
INT_RANGE = range(-INT_MAX - 1, INT_MAX + 1)


def _check_value(tp: Any, value: Any, where: str) -> Any:
    """Check one TOML value against a field annotation (ddpkit.train.dataclass_fields),
    integers within INT_MAX."""
    value = dataclass_fields.check_value(tp, value, where, SpecError)
    _check_ints(value, where)
    return value


def _check_ints(value: Any, where: str) -> None:
    """Every integer in a value (its tables, lists and nested tables too) within INT_MAX."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _check_ints(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_ints(item, f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            _check_ints(item, where)
    elif isinstance(value, int) and not isinstance(value, bool) and value not in INT_RANGE:
        bound = f"over {INT_MAX}" if value > 0 else f"under {-INT_MAX - 1}"
        raise SpecError(
            f"{where} = {value} is {bound} (a signed 32-bit integer, what the schedulers "
            "store); give a value in range"
        )


def _build(
    cls: type, table: dict[str, Any], where: str, sections: dict[str, type | None] | None = None
) -> Any:
    """A dataclass from its TOML table, every value type-checked (SpecError naming the key).
    sections: at the top level, the engines' tables the file may hold, by name -> their
    Options (typed here; its checks are the engine's, check_options), or None (kept as
    written: another plugin backend's table)."""
    hints = get_type_hints(cls)
    known = dataclass_fields.keys(cls)
    sections = sections or {}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        dotted = f"{where}.{key}" if where else key
        if cls is JobSpec and name not in known and key in sections:
            opts_cls = sections[key]
            options = _check_value(opts_cls, value, key) if opts_cls is not None else value
            kwargs.setdefault("backend_options", {})[key] = options
            continue
        if name not in known:
            section = f"[{where}]" if where else "the top level"
            valid = known + list(sections) if cls is JobSpec else known
            raise SpecError(f"unknown key {dotted!r}; {valid_keys(name, valid, section)}")
        if name == "train" and cls is JobSpec:
            kwargs[name] = _check_train(value)
        else:
            kwargs[name] = _check_value(hints[name], value, dotted)
            if cls is JobSpec:
                dataclass_fields.run_checks(cls, name, kwargs[name], dotted, SpecError)
    return cls(**kwargs)


def _check_train(table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SpecError(f"train must be a table of training flags, got {table!r}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in TRAIN_KEYS:
            raise SpecError(f"unknown key 'train.{key}'; {valid_keys(name, TRAIN_KEYS, '[train]')}")
        try:
            out[name] = _convert_train_value(name, value, "train")
        except ConfigError as e:
            raise SpecError(str(e)) from None
    return out


# --- overrides -------------------------------------------------------------------------------


def _field_type(path: list[str], sections: dict[str, type | None] | None = None) -> Any:
    """The annotation at a dotted path (train.* from TrainConfig; an engine's table from its
    Options), or raise SpecError."""
    cls: Any = JobSpec
    sections = sections or {}
    dotted, full = ".".join(path), path
    if path[0] in sections and path[0] not in dataclass_fields.keys(JobSpec):
        if sections[path[0]] is None:
            return Any  # another backend's table: parsed as TOML, checked by its backend
        if len(path) == 1:
            return sections[path[0]]  # the whole table (`--set slurm=...`)
        cls, path = sections[path[0]], path[1:]
        prefix = 1
    else:
        prefix = 0
    for i, part in enumerate(path):
        name = part.replace("-", "_")
        if cls is TrainConfig:
            if name not in TRAIN_KEYS or i != len(path) - 1:
                raise SpecError(
                    f"--set {dotted}: unknown key {part!r}; {valid_keys(name, TRAIN_KEYS, '[train]')}"
                )
            return get_type_hints(TrainConfig)[name]
        names = dataclass_fields.keys(cls) + (list(sections) if cls is JobSpec else [])
        if name not in names:
            where = f"[{'.'.join(full[: i + prefix])}]" if i or prefix else "the top level"
            raise SpecError(
                f"--set {dotted}: unknown key {part!r}; {valid_keys(name, names, where)}"
            )
        tp = TrainConfig if (cls is JobSpec and name == "train") else get_type_hints(cls)[name]
        if i == len(path) - 1:
            return tp  # as annotated: "none" clears an optional field
        tp, _ = dataclass_fields.unwrap_optional(tp)
        if get_origin(tp) is dict:  # env.FOO=bar, k8s.node_selector.x=y
            if i != len(path) - 2:
                raise SpecError(f"--set {dotted}: too many dots")
            return get_args(tp)[1]
        if not (dataclasses.is_dataclass(tp) or tp is TrainConfig):
            raise SpecError(f"--set {dotted}: {part} is not a table")
        cls = tp
    return cls


def parse_override_value(tp: Any, raw: str) -> Any:
    """A --set value for a field of type tp (ddpkit.train.dataclass_fields.parse_text)."""
    return dataclass_fields.parse_text(tp, raw, SpecError)


def apply_override(
    data: dict[str, Any], assignment: str, sections: dict[str, type | None] | None = None
) -> None:
    """Apply one `dotted.key=value` to the raw TOML dict (checked again when built)."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"--set {assignment!r}: expected key=value, e.g. --set slurm.partition=gpu")
    path = key.split(".")
    if path in (["args"], ["train_args"]) and not raw.lstrip().startswith("["):
        # An argv: split as a shell would (`--set 'args=--epochs 2'` is two arguments)
        try:
            data[key] = shlex.split(raw)
        except ValueError as e:
            raise SpecError(
                f"--set {key}={raw!r} does not split into arguments ({e}); fix the quotes, "
                'or give a TOML list: --set \'args=["--epochs", "2"]\''
            ) from None
        return
    try:
        value = parse_override_value(_field_type(path, sections), raw)
    except SpecError as e:
        if str(e).startswith("--set"):
            raise
        raise SpecError(f"--set {key}: {e}; fix the value") from None
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {key}: {part} is not a table in the file")
        node = child
    node[path[-1]] = value


# --- validation ----------------------------------------------------------------------------


def validate(spec: JobSpec, local_paths: bool = True) -> JobSpec:
    """Checks across fields. Each message names the value and the fix. local_paths: the
    nodes see this machine's files (local, SLURM's shared filesystem), so the training
    inputs are looked up here too; False for container backends."""
    # The single-value rules are declared on the fields (dataclass_fields.checks) and ran as the
    # spec was built; these are the ones across fields.
    _validate_entry(spec)
    _validate_train(spec, local_paths)
    _validate_fault_tolerance(spec)
    return spec  # each backend's own rules: Backend.validate (tools/backends/)


def _validate_entry(spec: JobSpec) -> None:
    if spec.module is not None and spec.script is not None:
        raise SpecError(
            f"module = {spec.module!r} and script = {spec.script!r}: set one entry point, not both"
        )
    if spec.module is not None and not MODULE_RE.match(spec.module):
        raise SpecError(
            f"module {spec.module!r} is not a Python module path; use dotted names, e.g. "
            '"mypkg.train" (what `python -m` takes)'
        )
    if spec.script is not None and not dataclass_fields.is_plain_path(spec.script):
        raise SpecError(
            f"script {spec.script!r} is not a script path; use a .py path relative to the "
            'workspace (the job file\'s directory), e.g. "train.py"'
        )
    if spec.default_entry and spec.args:
        raise SpecError(
            "args are the arguments of your own module/script; the kit trainer's flags go in "
            "[train] (or after --): set module or script, or move them"
        )
    if not spec.default_entry:
        extra = sorted(set(spec.train) - ENTRY_NEUTRAL_TRAIN_KEYS)
        if extra:
            raise SpecError(
                f"[train] {', '.join(extra)}: the kit trainer's flags do not reach your "
                f"{'module' if spec.module else 'script'}; pass them in args = [...] "
                f"([train] keeps only {', '.join(sorted(ENTRY_NEUTRAL_TRAIN_KEYS))} here)"
            )


def _validate_train(spec: JobSpec, local_paths: bool = True) -> None:
    for key in ("run_dir", "ckpt_dir"):
        value = spec.train.get(key)
        if isinstance(value, str) and value.strip() and not dataclass_fields.is_plain_path(value):
            raise SpecError(
                f"train.{key} {value!r} starts with '-' or contains a newline; use a plain "
                "path (e.g. runs/mine)"
            )
    timeout = spec.shutdown_timeout_s
    if not math.isfinite(timeout) or timeout <= 0 or timeout > MAX_SHUTDOWN_S:
        raise SpecError(
            f"train.shutdown_timeout_s = {timeout!r} must be a number of seconds in "
            f"(0, {MAX_SHUTDOWN_S}]; e.g. 120"
        )
    if spec.default_entry:
        # The trainer's own parse + validate on the exact argv the nodes will get, with the
        # world size they will have: one typed config, no copy of its rules here.
        try:
            parse_config(
                spec.train_argv(),
                world=(spec.world_size, spec.nodes),
                installed=False,
                local_paths=local_paths,
            )
        except ConfigError as e:
            raise SpecError(str(e)) from None  # the trainer's own message, word for word


def _validate_fault_tolerance(spec: JobSpec) -> None:
    if spec.fault_tolerance != "torchft":
        if spec.replica_groups is not None:
            raise SpecError(
                f'replica_groups = {spec.replica_groups} is for fault_tolerance = "torchft"; '
                "set that too, or drop replica_groups"
            )
        return
    if spec.groups < 2:
        raise SpecError(
            f"fault_tolerance = torchft with {spec.groups} replica group: the others train on "
            "while one restarts, so it needs 2 or more; set replica_groups = 2 (or "
            'fault_tolerance = "none")'
        )
    if spec.nodes > 1 and spec.nodes % spec.groups:
        raise SpecError(
            f"fault_tolerance = torchft: {spec.nodes} nodes do not split into "
            f"{spec.groups} replica groups of whole nodes; set replica_groups to a divisor "
            f"of {spec.nodes}"
        )


BUILTIN_JOB = "builtin:default"  # the kit's own default job (configs/default.toml in the kit)
JOB_FILE = "ddpkit.toml"  # the project's job file, as `ddpkit init` writes it


def default_job_file() -> str:
    """./ddpkit.toml when the current directory has one, else the kit's built-in job."""
    return JOB_FILE if Path(JOB_FILE).is_file() else BUILTIN_JOB


def builtin_job_path() -> Path:
    from ddpkit.tools.templating import KIT_DIR

    return KIT_DIR / "configs" / "default.toml"


def resolve_workspace(path: str | Path | None, data: dict[str, Any]) -> Path:
    """The workspace rule, stated once: the job file's directory, or its `workspace` key
    (relative to that directory); the current directory for the built-in job."""
    if path is None or str(path) == BUILTIN_JOB:
        return Path.cwd()
    base = Path(path).resolve().parent
    value = data.get("workspace")
    if value is None:
        return base
    if not isinstance(value, str) or not dataclass_fields.is_plain_path(value):
        raise SpecError(f'workspace {value!r} is not a directory path; use e.g. ".."')
    ws = (base / value).resolve()
    if not ws.is_dir():
        raise SpecError(
            f"workspace {value!r} ({ws}) is not a directory; fix the path (it is relative to "
            f"the job file's directory {base})"
        )
    return ws


@contextlib.contextmanager
def in_workspace(workspace: str | Path) -> Iterator[None]:
    """Run a block as the nodes will: in the workspace, with it first on sys.path (import
    paths such as mypkg.models:build resolve from it). Restores both afterwards."""
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(workspace)
    sys.path.insert(0, str(workspace))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


def load_spec(
    path: str | Path | None,
    sets: list[str] | None = None,
    nodes: int | None = None,
    gpus: int | None = None,
    train_args: list[str] | None = None,
    local_paths: bool = True,
    sections: dict[str, type | None] | None = None,
) -> JobSpec:
    """Load, override, type-check and validate a job file (BUILTIN_JOB: the kit's default
    job). Relative paths are checked against the workspace. sections: the plugin backends'
    tables the file may hold (name -> Options to type it, or None); the built-in engines'
    (registry.builtin_options) are typed always, their defaults filled. Raises SpecError."""
    from ddpkit.tools.backends.registry import builtin_options

    builtin = builtin_options()
    sections = {**builtin, **dict(sorted((sections or {}).items()))}
    data: dict[str, Any] = {}
    if path is not None:
        source = builtin_job_path() if str(path) == BUILTIN_JOB else path
        try:
            data = read_toml(source)
        except ConfigError as e:
            raise SpecError(str(e)) from None
    for assignment in sets or []:
        apply_override(data, assignment, sections)
    workspace = resolve_workspace(path, data)
    data["workspace"] = str(workspace)
    if nodes is not None:
        data["nodes"] = nodes
    if gpus is not None:
        data["nproc_per_node"] = gpus
    if train_args:
        data["train_args"] = list(data.get("train_args", [])) + list(train_args)
    spec = _build(JobSpec, data, "", sections)
    tables = spec.backend_options  # the built-in engines' first, as a file lists them
    spec.backend_options = {n: tables[n] if n in tables else cls() for n, cls in builtin.items()}
    spec.backend_options.update((k, v) for k, v in tables.items() if k not in builtin)
    with in_workspace(workspace):
        return validate(spec, local_paths)
