"""What each test costs in CPU, and which test a coverage measurement belongs to.

CPU: the suite is CPU-bound on these 2 cores (docs/development.md), so a test's wall time says
little about what it takes from the other lane; its CPU does. When DDPKIT_TEST_CPU_DIR is set
(tests/lanes.py sets it for every run), each pytest process appends one JSON line per test to
`<dir>/<pid>.jsonl`: the test's id and the CPU seconds of the pytest process itself plus the
children it waited for in the meantime (RUSAGE_CHILDREN: torchrun and its workers, `ddpkit run`,
sbatch and kubectl), over setup, call and teardown. Not in it: daemons nobody waits for (the
SLURM daemons and the jobs under them, podman's containers, the Kubernetes control plane and
its pods), so the engine tests' figures are a floor.

Coverage: under `python -m tests.coverage_run` every Python process starts coverage.py
(COVERAGE_PROCESS_START); the pytest process switches its context to each test's id here,
and the processes a test starts inherit DDPKIT_COV_CONTEXT, which the run's config makes their
context. So the combined data says which tests ran each line.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

CPU_DIR_ENV = "DDPKIT_TEST_CPU_DIR"
COV_CONTEXT_ENV = "DDPKIT_COV_CONTEXT"


def cpu_seconds() -> float:
    """CPU of this process and of the children it has waited for, user + system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class TestCost:
    test: str
    cpu: float
    wall: float


def record(directory: str, cost: TestCost) -> None:
    with open(Path(directory) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(cost.__dict__) + "\n")


def measure(nodeid: str):
    """The conftest hookwrapper's body (`yield from`): records one test's whole protocol (setup,
    call, teardown) when DDPKIT_TEST_CPU_DIR is set."""
    directory = os.environ.get(CPU_DIR_ENV)
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    yield
    if directory:
        record(directory, TestCost(nodeid, cpu_seconds() - cpu0, time.monotonic() - wall0))


def read_costs(directory: Path) -> list[TestCost]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append(TestCost(**json.loads(line)))
    return out


def cost_table(costs: list[TestCost], top: int) -> list[str]:
    """The `top` tests by CPU, heaviest first, and the sum over all of them."""
    lines = [
        f"the tests' CPU (pytest + the children it waited for): {sum(c.cpu for c in costs):.0f}"
        f" CPU-s over {len(costs)} tests; the {min(top, len(costs))} heaviest:"
    ]
    for c in sorted(costs, key=lambda c: -c.cpu)[:top]:
        lines.append(f"{c.cpu:7.1f} CPU-s {c.wall:6.1f} s wall  {c.test}")
    return lines


def enter_test(nodeid: str) -> None:
    """Under the coverage run: what runs from here on (here and in the processes this test
    starts) is measured as this test's."""
    if not os.environ.get("COVERAGE_PROCESS_START"):
        return
    os.environ[COV_CONTEXT_ENV] = nodeid
    try:
        import coverage
    except ImportError:
        return
    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(nodeid)
