"""The shape of a JSON document the kit reads back, checked one way for every reader.

What the kit writes and later reads again (checkpoint markers, lock files, job records,
requeue markers, summaries, metrics lines) may be found damaged or replaced: a file cut
short, edited by hand, or another program's file under the same name. Decoding is not
enough: a marker whose records are numbers passes json.loads and fails much later as an
AttributeError deep inside a load. `check` says up front, in one phrase, what is not as
expected; `load` / `loads` also read and decode. Each reader turns a ShapeError into its one
warning or one line, and its fallback.

A shape is
- a type or a tuple of types: str, int, float, bool, list, dict, None (null). `int` never
  takes a bool, `float` takes an int (JSON has one number type);
- `{key: shape}`: an object with these keys (`Opt(shape)` for one that may be absent; keys
  not named are allowed, for files written by a newer version);
- `MapOf(shape)`: an object with any keys whose values all have `shape`;
- `ListOf(shape)`: a list whose items all have `shape`.

Stdlib only: ddpkit.train.contract imports it on the nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ShapeError(ValueError):
    """A JSON document that is not what its reader expects (message: where and what)."""


@dataclass(frozen=True)
class Opt:
    """A key that may be absent (present, its value has `shape`)."""

    shape: Any


@dataclass(frozen=True)
class MapOf:
    """An object of any keys whose values have `shape` (a checkpoint marker's file list)."""

    shape: Any


@dataclass(frozen=True)
class ListOf:
    """A list whose items have `shape`."""

    shape: Any


_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def _kind(value: Any) -> str:
    name = _NAMES.get(type(value), f"a {type(value).__name__}")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        shown = repr(value)
        return f"{name} ({shown if len(shown) <= 40 else shown[:37] + '...'})"
    return name


def _fits(value: Any, t: type | None) -> bool:
    if t is None or t is type(None):
        return value is None
    if isinstance(value, bool):
        return t is bool
    if t is float:
        return isinstance(value, (int, float))
    return isinstance(value, t)


def _fail(where: str, what: str) -> ShapeError:
    return ShapeError(f"{where}: {what}" if where else what)


def check(value: Any, shape: Any, where: str = "") -> Any:
    """`value` when it has `shape`, else ShapeError naming the first place that does not
    (`where`: the path to `value`, '' for the document itself)."""
    if isinstance(shape, MapOf):
        check(value, dict, where)
        for key, item in value.items():
            check(item, shape.shape, f"{where}[{key!r}]")
    elif isinstance(shape, ListOf):
        check(value, list, where)
        for i, item in enumerate(value):
            check(item, shape.shape, f"{where}[{i}]")
    elif isinstance(shape, dict):
        check(value, dict, where)
        for key, sub in shape.items():
            optional = isinstance(sub, Opt)
            if key not in value:
                if optional:
                    continue
                raise _fail(where, f"no {key!r} key")
            check(value[key], sub.shape if optional else sub, f"{where}.{key}" if where else key)
    else:
        types = shape if isinstance(shape, tuple) else (shape,)
        if not any(_fits(value, t) for t in types):
            want = " or ".join(_NAMES.get(t or type(None), str(t)) for t in types)
            raise _fail(where, f"{_kind(value)}, not {want}")
    return value


def loads(text: str, shape: Any) -> Any:
    """The JSON document in `text`, checked against `shape`; ShapeError for empty text and
    text that is not JSON too."""
    if not text.strip():
        raise ShapeError("empty")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: lists nested too deep
        raise ShapeError(f"not JSON ({type(e).__name__}: {e})") from None
    return check(value, shape)


def load(path: str | Path, shape: Any) -> Any:
    """The JSON file at `path`, checked against `shape`. OSError (missing, unreadable) is the
    caller's to tell apart; bytes that are not UTF-8 are a ShapeError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ShapeError("not UTF-8 text") from None
    return loads(text, shape)


__all__ = ["ListOf", "MapOf", "Opt", "ShapeError", "check", "load", "loads"]
