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
    module_name, _, cls_name = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def builtin_options() -> dict[str, type]:
    """The built-in engines' Options by name, in BACKENDS' order: the tables every job
    file may hold, typed whichever engine acts on the job."""
    classes = {name: builtin_class(name) for name in BACKENDS}
    return {name: cls.Options for name, cls in classes.items() if cls.Options is not None}
