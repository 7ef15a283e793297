"""Damaged versions of a JSON document the kit reads back, for its readers' tests.

`damaged(doc, types)` yields (label, bytes) for every whole-document damage (another JSON
type, not JSON, cut short, empty, not UTF-8, nested too deep) and, for each key the test
names, the key missing (when required) and its value of every JSON type the key may not
have. The allowed types are restated by each test (not read from the kit's shapes), so a
shape that forgets a key or a type fails its reader's test.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Iterator
from typing import Any

SAMPLES: dict[str, Any] = {
    "integer": 7,
    "number": 1.5,
    "string": "x",
    "list": [1],
    "object": {"k": 1},
    "boolean": True,
    "null": None,
}

WHOLE: list[tuple[str, bytes]] = [
    ("a number", b"3"),
    ("a list", b"[1, 2]"),
    ("a list of objects", b'[{"step": 3}]'),
    ("a string", b'"x"'),
    ("null", b"null"),
    ("true", b"true"),
    ("empty", b""),
    ("blank", b" \n"),
    ("not JSON", b"{not json"),
    ("cut short", b'{"step": '),
    ("not UTF-8", b"\xff\xfe{\x00"),
    ("nested too deep", b"[" * 100_000),
]


def _at(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def damaged(
    doc: dict[str, Any],
    types: dict[str, tuple[str, ...]],
    required: Collection[str] = (),
    at: tuple[str, ...] = (),
    whole: bool = True,
) -> Iterator[tuple[str, bytes]]:
    """(label, file bytes) of each damage of `doc`. `types`: key -> the JSON types (SAMPLES'
    names) it may have, for the object at path `at` inside doc; "number" admits integers."""
    if whole:
        yield from WHOLE
    where = ".".join(at)
    for key, allowed in types.items():
        name = f"{where}.{key}" if where else key
        if key in required:
            broken = copy.deepcopy(doc)
            del _at(broken, at)[key]
            yield f"{name} missing", json.dumps(broken).encode()
        for kind, value in SAMPLES.items():
            if kind in allowed or (kind == "integer" and "number" in allowed):
                continue
            broken = copy.deepcopy(doc)
            _at(broken, at)[key] = value
            yield f"{name} {kind}", json.dumps(broken).encode()


def cases(*groups: Iterator[tuple[str, bytes]]) -> dict[str, bytes]:
    """label -> bytes of several damaged() groups (for pytest ids)."""
    return {label: body for group in groups for label, body in group}


# A checkpoint marker as the manager writes it (ddpkit.train.ckpt.manager._finish) and the
# JSON types of its keys; every key may be absent in an older marker, its records may not.
MARKER: dict[str, Any] = {
    "step": 6,
    "world_size": 2,
    "parallel": "ddp",
    "sharding": None,
    "model": "mlp",
    "optimizer": "adamw",
    "global_batch": 32,
    "epoch": 0,
    "consumed": 192,
    "seed": 0,
    "samples": 1024,
    "save_s": 0.12,
    "time": 1.7e9,
    "files": {"__0_0.distcp": {"bytes": 10, "crc32": "0000abcd"}},
}
MARKER_TYPES = {
    **dict.fromkeys(
        ("step", "world_size", "global_batch", "epoch", "consumed", "seed", "samples"),
        ("integer",),
    ),
    **dict.fromkeys(("parallel", "model", "optimizer"), ("string",)),
    "sharding": ("string", "null"),
    "save_s": ("number",),
    "time": ("number",),
    "files": ("object",),
}


def marker_cases() -> dict[str, bytes]:
    """Every damage of MARKER: the document, its keys, its file list, one file's record."""
    return cases(
        damaged(MARKER, MARKER_TYPES),
        damaged(MARKER, {"__0_0.distcp": ("object",)}, at=("files",), whole=False),
        damaged(
            MARKER,
            {"bytes": ("integer",), "crc32": ("string",)},
            required={"bytes", "crc32"},
            at=("files", "__0_0.distcp"),
            whole=False,
        ),
    )
