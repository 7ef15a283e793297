"""The engines by name: a built-in engine is its package plus one line in BACKENDS; a plugin
is one entry point in the group ENTRY_POINT_GROUP (`mine = "mypkg.backend:MyBackend"`).

Names only, as "module:Class" strings, imported when used: the job spec asks here for the
built-in engines' Options (their `[slurm]`, `[k8s]`, `[docker]` tables), the launcher for the
backend acting on a job (load_backend). Nothing of ddpkit is imported at module level, so the
job spec (tools/jobspec) may read it without reaching the engines' code through an import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
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
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


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
