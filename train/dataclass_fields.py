"""The one typed-config engine: dataclass annotations <-> TOML values <-> command-line text.

The training config (train/config.py) and the job spec (tools/jobspec.py) are dataclasses whose
annotations are their schema. This module is what both use to:

- check one TOML value against an annotation (`check_value`), naming the key of a bad value;
- build a dataclass from a TOML table (`build`), unknown keys named with the valid ones;
- parse a command-line string (`--set key=value`, a flag) for an annotation (`parse_text`);
- spell a field as its flag (`flag`, `no_flag`), and add every field to an argparse parser
  as one (`add_arguments`), with the help text read from the field's trailing comment
  (`field_comments`);
- apply the validators declared on the fields (`field(metadata=checks(...))`): a range, a
  port, a plain path, a pattern. A hostile-input check is then one predicate on one field,
  applied wherever the value comes from (file, --set, a CLI flag that fills the table).

It sits at the bottom of the trainer's layers (errors below it, nothing of the kit above).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import tomllib
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ddpkit.train.errors import UserError, valid_keys

Check = Callable[[Any, str], "str | None"]  # (value, key) -> None, or the problem and its fix


def flag(name: str) -> str:
    """A field's command-line flag: `ckpt_dir` -> `--ckpt-dir` (the one spelling)."""
    return "--" + name.replace("_", "-")


def flag_args(flag_name: str, value: str) -> list[str]:
    """`flag VALUE` as argv words that hand VALUE back byte for byte: argparse takes a value
    that starts with '-' (`-data`, `--`) for a flag of its own, so that one is `flag=VALUE`."""
    return [f"{flag_name}={value}"] if value.startswith("-") else [flag_name, value]


def no_flag(name: str) -> str:
    """A boolean field's off switch: `compile` -> `--no-compile`."""
    return "--no-" + name.replace("_", "-")


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, else (tp, False)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def type_name(tp: Any) -> str:
    """How an annotation reads in a message: int, 'a' | 'b', table, array (or unset)."""
    tp, optional = unwrap_optional(tp)
    if get_origin(tp) is Literal:
        name = " | ".join(repr(a) for a in get_args(tp))
    elif dataclasses.is_dataclass(tp) or get_origin(tp) is dict:
        name = "table"
    elif get_origin(tp) is list:
        name = "array"
    else:
        name = getattr(tp, "__name__", str(tp))
    return name + (" (or unset)" if optional else "")


def check_value(tp: Any, value: Any, where: str, error: type[UserError] = UserError) -> Any:
    """Check one TOML value against an annotation; returns it (ints widened to float).
    `where` is the key as the user wrote it (dotted)."""
    tp, optional = unwrap_optional(tp)
    if value is None and optional:
        return None
    origin = get_origin(tp)
    bad = error(f"{where} must be {type_name(tp)}, got {value!r}; fix the value")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return build(tp, value, where, error)
    if origin is Literal:
        if value not in get_args(tp):
            choices = ", ".join(str(a) for a in get_args(tp))
            raise error(f"{where} = {value!r} is not one of {choices}; pick one of them")
        return value
    if origin is list:
        (item_tp,) = get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise bad
        return [check_value(item_tp, v, f"{where}[{i}]", error) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        _, val_tp = get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise bad
        return {str(k): check_value(val_tp, v, f"{where}.{k}", error) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp in (int, float) and isinstance(value, bool):  # bool is an int subclass in Python
        raise error(
            f"{where} must be {tp.__name__}, got {str(value).lower()}; booleans are not numbers"
        )
    if tp is float and isinstance(value, int):
        return float(value)
    if tp in (int, float, str) and not isinstance(value, tp):
        raise bad
    return value


def keys(cls: type) -> list[str]:
    """A dataclass's keys in a file (fields marked internal are not keys)."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def build(cls: type, table: dict[str, Any], where: str, error: type[UserError] = UserError) -> Any:
    """A dataclass from its TOML table: every value type-checked, every declared check run
    ('-' in keys read as '_'); unknown keys are named with the valid ones."""
    hints = get_type_hints(cls)
    known = keys(cls)
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        dotted = f"{where}.{key}" if where else key
        if name not in known:
            section = f"[{where}]" if where else "the top level"
            raise error(f"unknown key {dotted!r}; {valid_keys(name, known, section)}")
        kwargs[name] = check_value(hints[name], value, dotted, error)
        if not getattr(cls, "__backend_options__", False):
            run_checks(cls, name, kwargs[name], dotted, error)
    return cls(**kwargs)


def run_checks(cls: type, name: str, value: Any, where: str, error: type[UserError]) -> None:
    """The checks declared on field `name` of `cls` (metadata "checks"), on a typed value."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    for check in f.metadata.get("checks", ()):
        problem = None if value is None else check(value, where)
        if problem:
            raise error(problem)


def check_all(obj: Any, where: str, error: type[UserError] = UserError) -> None:
    """Every declared check of a built dataclass (nested ones too): how a backend applies
    the rules of its own options table (classes marked `__backend_options__ = True` are not
    checked as they are built, so a bad [slurm] value never refuses a Kubernetes job)."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value):
            check_all(value, key, error)
        else:
            run_checks(type(obj), f.name, value, key, error)


def parse_text(tp: Any, raw: str, error: type[UserError] = UserError) -> Any:
    """A command-line string for a field of type tp: strings stay verbatim; `none`/`null`/''
    clear an optional field; booleans take true/false/1/0/yes/no/on/off; the rest is a TOML
    value (a list also as a,b,c)."""
    base, optional = unwrap_optional(tp)
    if optional and raw in ("", "none", "null"):
        return None
    if base is str or get_origin(base) is Literal:
        return raw
    if base is bool:
        low = raw.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise error(f"expected true or false, got {raw!r}")
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if get_origin(base) is list:  # a,b,c as a list of strings
            return [s for s in raw.split(",") if s]
        raise error(f"cannot parse {raw!r} as {type_name(base)}") from None


# --- validators declared on fields: field(default=..., metadata=checks(at_least(1))) --------


def checks(*fns: Check, **more: Any) -> dict[str, Any]:
    """Field metadata holding validators (each (value, key) -> None or the message)."""
    return {"checks": fns, **more}


def at_least(lo: float, label: str | None = None, fix: str | None = None) -> Check:
    """value >= lo (finite). label replaces the key in the message; fix ends it."""

    def check(value: Any, where: str) -> str | None:
        if (isinstance(value, float) and not math.isfinite(value)) or value < lo:
            tail = f"; {fix}" if fix else ""
            return f"{label or where} must be >= {lo}, got {value}{tail}"
        return None

    return check


def port(label: str | None = None, fix: str = "use 1-65535 (e.g. 29500)") -> Check:
    """A TCP port, 1-65535."""

    def check(value: Any, where: str) -> str | None:
        if not 1 <= value <= 65535:
            return f"{label or where} {value} is not a port; {fix}"
        return None

    return check


def matches(pattern: str, message: str) -> Check:
    """The whole value matches the regular expression; message may use {key} and {value!r}."""
    rx = re.compile(pattern)

    def check(value: Any, where: str) -> str | None:
        if not rx.fullmatch(str(value)):
            return message.format(key=where, value=value)
        return None

    return check


def is_plain_path(value: Any) -> bool:
    """The one hostile-input predicate for a path: not empty, no leading '-' (a shell, an
    engine or an argument parser would read it as an option), no newline."""
    text = str(value)
    return bool(text.strip()) and not text.startswith("-") and "\n" not in text


def is_plain_token(value: Any) -> bool:
    """A plain path without whitespace at all: an image reference, a name on a command line."""
    return is_plain_path(value) and not any(c.isspace() for c in str(value))


def plain_path(example: str) -> Check:
    """A path no shell or argument parser reads as something else (is_plain_path)."""

    def check(value: Any, where: str) -> str | None:
        if not is_plain_path(value):
            return f"{where} {value!r} starts with '-' or contains a newline; use a plain path (e.g. {example})"
        return None

    return check


# --- the command line: a dataclass's fields as argparse flags ---------------------------------


def field_comments(cls: type) -> dict[str, str]:
    """Each field's trailing `# ...` comment in the class's source: the one home of its text.

    The comments stay readable beside the fields (where reviewers look) and reach --help
    without a second copy in field metadata that would drift.
    """
    import ast
    import inspect
    import io
    import tokenize

    src = inspect.getsource(cls)
    spans: dict[str, tuple[int, int]] = {}
    for node in ast.parse(src).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            spans[node.target.id] = (node.lineno, node.end_lineno or node.lineno)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return {
        name: " ".join(comments[i] for i in range(lo, hi + 1) if i in comments)
        for name, (lo, hi) in spans.items()
    }


def base_type(tp: Any) -> tuple[type, tuple[str, ...] | None]:
    """(python type, choices) of a field annotation, unwrapping `X | None` and Literal."""
    if get_origin(tp) is dict:
        return dict, None
    args = [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) else []
    if args and get_origin(tp) is not Literal:
        tp = args[0]
    if get_origin(tp) is Literal:
        return str, tuple(get_args(tp))
    return tp, None


def _default_text(value: Any, tp: type) -> str:
    """The default as the user would type it; '' when unset (the comment says what happens)."""
    if value is None or value == "":
        return ""
    if tp is bool:
        return "on" if value else "off"
    return str(value)


_METAVAR = {int: "N", float: "X", str: "S"}


def json_table(text: str) -> dict[str, Any]:
    """A flag's JSON object (a dict field), or argparse's error naming the expected shape."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'{text!r} is not a JSON object such as {{"width": 64}}')
    return value


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of the dataclass `cls` (a field with metadata cli=False has none):
    `--x/--no-x` for a bool, a JSON object for a dict, choices for a Literal. Every default
    is None, so a flag the user did not pass never overrides a file; the real default is in
    the help text, once, and only when set."""
    hints, texts, defaults = get_type_hints(cls), field_comments(cls), cls()
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli") is False:
            continue
        tp, choices = base_type(hints[f.name])
        shown = _default_text(getattr(defaults, f.name), tp)
        text = texts.get(f.name, "") + (f" (default: {shown})" if shown else "")
        if tp is bool:
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=text,
            )
        elif tp is dict:
            parser.add_argument(flag(f.name), dest=f.name, type=json_table, default=None, help=text)
        else:
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                type=tp,
                choices=choices,
                default=None,
                metavar="{" + ",".join(choices) + "}" if choices else _METAVAR.get(tp, "S"),
                help=text,
            )
