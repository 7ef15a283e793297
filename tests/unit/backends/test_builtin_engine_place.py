"""A new engine tells its nodes where they are in its own render, and runs the one command
builder's line: the toy engine of test_builtin_engine.py binds the launch contract's three
names (DDPKIT_NODE_NAME, DDPKIT_NODE_NUMBER, DDPKIT_SCHEDULER_ATTEMPT) from its scheduler's
own variables, and the worker's readers (ddpkit.train.contract, which the rank names, goodput
and chaos use) see its values. No file of train/ names the toy scheduler."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from ddpkit.tools.jobspec import load_spec, node_command, standalone

from tests.unit.backends.test_builtin_engine import toy  # noqa: F401  (the engine, registered)

READ = (
    "from ddpkit.train import contract; "
    "print(contract.node_name(), contract.node_number(), contract.scheduler_attempt())"
)


def test_the_toy_engine_binds_the_contracts_place_and_runs_the_builders_command(
    toy: Path,  # noqa: F811
) -> None:
    from toyengine.backend import ToyBackend  # the package the fixture wrote

    spec = load_spec(None, ["fault_tolerance=torchft", "toy.slots=2"])
    _, place, command = ToyBackend().render(spec).splitlines()
    assert shlex.split(command) == node_command(spec, standalone(spec.nproc_per_node))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}
    env.update(TOY_HOST="toy-node-7", TOY_INDEX="3", TOY_RETRIES="2")
    shell = f'{place}\nexec "$0" -c "$1"'
    r = subprocess.run(
        ["bash", "-c", shell, sys.executable, READ], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["toy-node-7", "3", "2"]
