"""The one Jinja environment every template renders through.

StrictUndefined turns a missing value into an error instead of an empty string. Values
reach a shell only through `shell_quote` and YAML only through `yaml_str` / `tojson`, so a
job name or a training flag can never become code.
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

# The folder that holds slurm/, k8s/ and docker/: the checkout's root in a development
# install, site-packages/ddpkit in a wheel's (package-dir maps both the same way).
KIT_DIR = Path(__file__).resolve().parent.parent


def shell_quote(value: Any) -> str:
    """One shell word, inert whatever it contains ($(), backticks, quotes, ;, newlines)."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    return shlex.quote(str(value))


def shell_join(values: Any) -> str:
    """Several shell words, each quoted."""
    return " ".join(shell_quote(v) for v in values)


def to_json(value: Any) -> str:
    """JSON text, which is also a valid YAML flow value (no HTML escaping, unlike Jinja's)."""
    return json.dumps(value, ensure_ascii=False)


def yaml_str(value: Any) -> str:
    """A YAML scalar that always parses back as the string str(value)."""
    return json.dumps(str(value), ensure_ascii=False)


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(KIT_DIR)),
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


__all__ = ["environment", "render_template", "shell_join", "shell_quote", "to_json", "yaml_str"]
