"""Sweeps: `--sweep train.lr=1e-3,3e-4 --sweep train.batch_size=32,64` is the product of the
keys' values, one job per combination, each named <name>-<i> with its own run dir.

Kubernetes and Docker run a sweep as N named jobs (N manifests / N containers, one after the
other on one machine); SLURM may run it as one job array. The members are built here, the
same way for every backend: the base spec's overrides, then the combination's, then the name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ddpkit.tools.jobspec import JobSpec, SpecError

MAX_MEMBERS = 1000  # a typo in a product should not queue ten thousand jobs


def combinations(sweeps: list[str]) -> list[list[str]]:
    """The `--set` assignments of each member, in order: the product of every key's values."""
    axes: list[list[str]] = []
    seen: set[str] = set()
    for item in sweeps:
        key, sep, raw = item.partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",")]
        if not sep or not key or not raw.strip() or "" in values:
            raise SpecError(
                f"--sweep {item!r}: expected key=v1,v2,... (e.g. --sweep train.lr=1e-3,3e-4)"
            )
        if key in seen:
            raise SpecError(f"--sweep {key} is given twice; list all its values in one --sweep")
        if key == "name":
            raise SpecError("--sweep name: members are named <name>-<i>; sweep another key")
        seen.add(key)
        axes.append([f"{key}={v}" for v in values])
    members = [list(combo) for combo in itertools.product(*axes)]
    if len(members) > MAX_MEMBERS:
        raise SpecError(
            f"--sweep makes {len(members)} jobs, over {MAX_MEMBERS}; sweep fewer values"
        )
    return members


def member_specs(
    load: Callable[[list[str]], JobSpec], sets: list[str], sweeps: list[str]
) -> list[JobSpec]:
    """One validated JobSpec per member; `load(sets)` builds a spec from `--set` items."""
    base = load(sets)
    specs = []
    for i, combo in enumerate(combinations(sweeps)):
        specs.append(load([*sets, *combo, f"name={base.name}-{i}"]))
    for key in ("run_dir", "ckpt_dir"):
        values = [str(_dir(s, key)) for s in specs]
        if len(set(values)) != len(values):
            raise SpecError(
                f"sweep members would share the {key} {values[0]!r} (set in the job file); "
                f"leave {key} unset so each member gets runs/<name>-<i>"
            )
    return specs


def _dir(spec: JobSpec, key: str) -> str:
    if key == "run_dir":
        return spec.run_dir
    return spec.checkpoint_dir
