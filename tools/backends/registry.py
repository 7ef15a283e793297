"""The engines by name: a built-in engine is its package plus one line in BACKENDS; a plugin
is one entry point in the group ENTRY_POINT_GROUP (`mine = "mypkg.backend:MyBackend"`).

Names only, as "module:Class" strings, imported when used: the job spec asks here for the
built-in engines' Options (their `[slurm]`, `[k8s]`, `[docker]` tables), the launcher for the
backend acting on a job (load_backend). Nothing of ddpkit is imported at module level, so the
job spec (tools/jobspec) may read it without reaching the engines' code through an import.
"""

from __future__ import annotations

import importlib
import importlib.machinery
from functools import cache
from typing import Any

BACKENDS = {
    "local": "ddpkit.tools.backends.local:LocalBackend",
    "slurm": "ddpkit.slurm.backend:SlurmBackend",
    "k8s": "ddpkit.k8s.backend:K8sBackend",
    "docker": "ddpkit.docker.backend:DockerBackend",
}
ENTRY_POINT_GROUP = "ddpkit.backends"  # plugins: name = "module:Class"

# Where the built-in engines' Options live (None: no table), read by builtin_options so that
# every job load (each `ddpkit run`) types [slurm], [k8s], [docker] without importing the
# engines' backends (their renders, cluster probes, templates: ~85 ms a call). A speed hint,
# never the definition: each Backend.Options is the class named here (a test holds them
# equal), and an engine missing here has its backend imported for its Options, as before.
OPTIONS = {
    "local": None,
    "slurm": "ddpkit.slurm.options:SlurmOptions",
    "k8s": "ddpkit.k8s.options:K8sOptions",
    "docker": "ddpkit.docker.options:DockerOptions",
}


def registered() -> dict[str, str]:
    """Every backend by name -> "module:Class": the built-in ones, then the plugins other
    packages register in the entry-point group ENTRY_POINT_GROUP (a plugin never replaces
    a built-in backend of the same name). Nothing is imported here."""
    found = dict(BACKENDS)
    for name, value in _plugins():
        found.setdefault(name, value)
    return found


@cache
def _plugins() -> tuple[tuple[str, str], ...]:
    """The entry points of ENTRY_POINT_GROUP, read once a process (one `ddpkit submit` asks
    4 times, and each read opens every installed distribution's metadata). importlib.metadata
    (~35 ms of imports, email.* among them) reads them only when some distribution on the
    import path names the group at all: on most machines none does (issue 34)."""
    if not _group_named_on_path():
        return ()
    import importlib.metadata

    return tuple(
        (ep.name, ep.value) for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )


def _group_named_on_path() -> bool:
    """Whether an entry_points.txt in a distribution's metadata on sys.path holds the group's
    header; True too wherever this quick look cannot be sure (a zip or egg on the path, a
    finder of its own that lists distributions): importlib.metadata then decides."""
    import os
    import sys

    header = f"[{ENTRY_POINT_GROUP}]"
    finders = [f for f in sys.meta_path if f is not importlib.machinery.PathFinder]
    if any(hasattr(f, "find_distributions") for f in finders):
        return True
    for d in sys.path:
        if not os.path.isdir(d or "."):
            if os.path.exists(d):
                return True  # a zip: its metadata is not read here
            continue
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(d or ".", name, "entry_points.txt")) as f:
                    if header in f.read():
                        return True
            except OSError:
                continue
    return False


def builtin_class(name: str) -> Any:
    """The Backend class of built-in engine `name`, imported now (the kit's own: an import
    error here is a bug of the kit, so it is not dressed as a user's mistake)."""
    return _imported(BACKENDS[name])


def _imported(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def builtin_options() -> dict[str, type]:
    """The built-in engines' Options by name, in BACKENDS' order: the tables every job
    file may hold, typed whichever engine acts on the job. Only the options modules are
    imported for the engines listed in OPTIONS."""
    found: dict[str, type | None] = {}
    for name in BACKENDS:
        if name in OPTIONS:
            path = OPTIONS[name]
            found[name] = None if path is None else _imported(path)
        else:
            found[name] = builtin_class(name).Options
    return {name: cls for name, cls in found.items() if cls is not None}
