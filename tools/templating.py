"""The one Jinja environment every template renders through.

StrictUndefined turns a missing value into an error instead of an empty string. Values
reach a shell only through `shell_quote` and YAML only through `yaml_str` / `tojson`, so a
job name or a training flag can never become code.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpkit.train.errors import UserError

if TYPE_CHECKING:
    import jinja2
    import yaml

# The folder that holds slurm/, k8s/ and docker/: the checkout's root in a development
# install, site-packages/ddpkit in a wheel's (package-dir maps both the same way).
KIT_DIR = Path(__file__).resolve().parent.parent


def check_passable(value: str) -> str:
    """`value` if a program can receive it unchanged as an argument or environment value;
    a NUL cannot (execve ends the string there), so it is refused at render, in one line."""
    if "\0" in value:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise UserError(
            f"{shown!r} holds a NUL character, which no argument or environment value can "
            "carry (the program would get it cut short); remove it"
        )
    return value


def shell_quote(value: Any) -> str:
    """One shell word, inert whatever it contains ($(), backticks, quotes, ;, newlines)."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    return shlex.quote(check_passable(str(value)))


def shell_join(values: Any) -> str:
    """Several shell words, each quoted."""
    return " ".join(shell_quote(v) for v in values)


def to_json(value: Any) -> str:
    """JSON text, which is also a valid YAML flow value (no HTML escaping, unlike Jinja's).
    What YAML reads as a line break or refuses raw (DEL, C1 controls, BOM) is escaped."""
    return json.dumps(value, ensure_ascii=False).translate(_JSON_ESCAPES)


def yaml_str(value: Any) -> str:
    """A YAML scalar on one line that always parses back as the string str(value)."""
    import yaml

    node = yaml.ScalarNode("tag:yaml.org,2002:str", str(value), style='"')
    text = yaml.serialize(node, Dumper=yaml_dumper(), allow_unicode=True, width=sys.maxsize)
    return text.rstrip("\n")


# --- YAML: every string scalar reads back as that string, whichever reader ------------------
# PyYAML's SafeDumper leaves a string bare when YAML 1.1 (its own reader) would read it as a
# string. Other readers resolve more: the Kubernetes API server (sigs.k8s.io/yaml, go-yaml v2)
# reads `1e-3` as a float, `0o17` and `1_0` as ints, `y`/`n` as booleans; YAML 1.2 readers
# read `1e3` and `.5e1` as floats. The union of what any of them could read as a non-string
# is quoted (a quoted scalar is a string to every reader); the rest stays as it looked.
YAML_BREAKS = "\x85\u2028\u2029"  # line breaks to YAML 1.1 and go-yaml, not to JSON
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in [*range(0x7F, 0xA0), 0x2028, 0x2029, 0xFEFF]}
_NON_STRING_WORDS = {"", "~", "null", "true", "false", "yes", "no", "on", "off", "y", "n", "<<"}
_NON_STRING = re.compile(
    r"""[-+]?(
        0[bB][01]+ | 0[oO]?[0-7]+ | 0[xX][0-9a-fA-F]+      # ints: Go's ParseInt(s, 0), YAML 1.1
      | [0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?                 # floats: 1.5, .5, 1e-3 (YAML 1.2)
      | [0-9]+\.[0-9]*([eE][-+]?[0-9]+)?                  # 1., 1.e3
      | [0-9]+(:[0-5]?[0-9])+(\.[0-9]*)?                  # sexagesimal (YAML 1.1): 1:30
      | \.(inf|nan)                                       # .inf, -.Inf, .NaN
    )
    | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt\s].*)?         # timestamps: 2024-01-01, 2024-1-2 10:00
    """,
    re.VERBOSE | re.DOTALL,
)


def yaml_reads_as_non_string(value: str) -> bool:
    """Whether some YAML reader would resolve `value`, written plain, to a non-string.
    Underscores are dropped first, as go-yaml and YAML 1.1 do inside numbers."""
    return value.lower() in _NON_STRING_WORDS or bool(_NON_STRING.fullmatch(value.replace("_", "")))


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    check_passable(value)
    if bad := re.search("[\ud800-\udfff]", value):
        # A byte that is not UTF-8 (an argument read with surrogateescape): YAML and JSON hold
        # text only, so the pod would get U+FFFD in its place.
        raise UserError(
            f"{value!r} holds the byte 0x{ord(bad[0]) & 0xFF:02x}, which is not UTF-8 text and "
            "cannot go into a YAML manifest as written; pass it as UTF-8"
        )
    if any(c in value for c in YAML_BREAKS):
        # PyYAML writes these raw in plain, single-quoted and block scalars, where a reader
        # folds them to a space or a newline; double quotes escape them (\N, \L, \P).
        style: str | None = '"'
    elif yaml_reads_as_non_string(value):
        style = "'"
    else:
        # The embedded script reads as a block; PyYAML falls back to quoting when a block
        # cannot hold the string exactly, so this changes the looks, never the value.
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


@cache
def yaml_dumper() -> type[yaml.SafeDumper]:
    """yaml.SafeDumper whose strings read back as strings to YAML 1.1, YAML 1.2 and go-yaml
    readers, and which writes shared dicts in full (no anchors: Kubernetes has none). Made
    on first use: yaml is ~15 ms of imports, and only the manifests need it (issue 34)."""
    import yaml

    class YamlDumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    YamlDumper.add_representer(str, _represent_str)
    return YamlDumper


def dump_yaml_all(docs: list[Any]) -> str:
    """YAML documents, each opening with --- (renders can be concatenated), keys in order."""
    import yaml

    return yaml.dump_all(
        docs,
        Dumper=yaml_dumper(),
        sort_keys=False,
        allow_unicode=True,
        width=100,
        explicit_start=True,
    )


@cache
def environment() -> jinja2.Environment:
    # jinja2 is imported here, on the first render: `ddpkit run`, status and the job spec use
    # only the quoting helpers above, and need not pay for it (issue 34: launch overhead).
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(KIT_DIR)),
        # Compiled templates kept between runs (jinja's per-user temp dir, checked against
        # each template's source): compiling the SLURM job's four costs ~13 ms a submit.
        bytecode_cache=jinja2.FileSystemBytecodeCache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        shell_quote=shell_quote, shell_join=shell_join, yaml_str=yaml_str, tojson=to_json
    )
    return env


def render_template(template: str, **context: Any) -> str:
    """Render a template by its path from the kit's folder, e.g. "slurm/sbatch.sh.j2"."""
    return environment().get_template(template).render(**context)


__all__ = [
    "check_passable",
    "dump_yaml_all",
    "environment",
    "render_template",
    "shell_join",
    "shell_quote",
    "to_json",
    "yaml_dumper",
    "yaml_reads_as_non_string",
    "yaml_str",
]
