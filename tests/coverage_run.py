"""`make coverage`: the whole suite (tests/lanes.py) under coverage.py, every Python process of
it measured, each measured line tagged with the test that ran it.

    .venv/bin/python -m tests.coverage_run [--dir DIR] [-- lanes arguments]

How: coverage.py's .pth hook (installed with it) starts coverage in every Python process that
has COVERAGE_PROCESS_START in its environment: the lanes, their pytest runs, and what the tests
start from them (`ddpkit run`, the node launcher, torchrun and its workers, sbatch'd steps on
the local SLURM cluster). The config names the test as each process's context
(DDPKIT_COV_CONTEXT, which tests/testcost.py sets before each test), and `patch = _exit` saves
the data of a process that leaves through os._exit. Not measured: code inside containers and
Kubernetes pods (their images carry their own interpreter), processes a test starts with a
whole new environment, and processes killed by SIGKILL (the drills' victims).

What it writes, into DIR (default: a new temp dir; the checkout is never written):
    report.txt    coverage.py's report of the kit's modules (`source_pkgs = ddpkit`)
    unique.txt    each test and the measured lines no other test runs, fewest first: a test
                  with none is one whose removal cannot lower the figure (it may still assert
                  something no other test does; read it before merging)
    .coverage     the combined data, for `coverage report/html --data-file DIR/.coverage`
The last lines printed are the total and where these are. Exit status: the lanes'.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]


def rc_text(data_dir: Path) -> str:
    # ${DDPKIT_COV_CONTEXT} is read by each process as it starts: the test that started it.
    return f"""\
[run]
source_pkgs = ddpkit
parallel = true
data_file = {data_dir}/.coverage
context = ${{DDPKIT_COV_CONTEXT}}
patch = _exit
disable_warnings = no-data-collected, module-not-measured, module-not-imported, couldnt-parse

[report]
precision = 1
skip_empty = true
"""


def unique_lines(data) -> dict[str, int]:
    """Each test (context) and how many measured lines only it runs. Lines also run outside
    any test (context "": collection, module imports) belong to no test alone."""
    unique = {_test(c): 0 for c in data.measured_contexts() if c}
    for path in data.measured_files():
        for contexts in data.contexts_by_lineno(path).values():
            tests = {_test(c) if c else "" for c in contexts}
            if len(tests) == 1 and "" not in tests:
                unique[tests.pop()] += 1
    return unique


def _test(context: str) -> str:
    """A context is the test's id, or `static|dynamic` where both were set: the test is the
    last part either way."""
    return context.rsplit("|", 1)[-1]


def unique_report(unique: dict[str, int]) -> list[str]:
    none = sorted(t for t, n in unique.items() if n == 0)
    lines = [
        f"{len(none)} of the {len(unique)} tests that ran kit code run no measured line that no"
        " other test runs"
    ]
    lines += [f"{n:6d}  {t}" for t, n in sorted(unique.items(), key=lambda tn: (tn[1], tn[0]))]
    return lines


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.coverage_run", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--dir", type=Path, help="where the data and reports go (default: a new temp dir)"
    )
    ap.add_argument("lanes", nargs="*", help="arguments for tests/lanes.py (after --)")
    args = ap.parse_args(argv)
    out = (args.dir or Path(tempfile.mkdtemp(prefix="ddpkit-cov-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rc = out / "coveragerc"
    rc.write_text(rc_text(out))
    env = {**os.environ, "COVERAGE_PROCESS_START": str(rc)}
    env.pop("DDPKIT_COV_CONTEXT", None)
    code = subprocess.call([sys.executable, "-m", "tests.lanes", *args.lanes], cwd=ROOT, env=env)

    cov = [sys.executable, "-m", "coverage"]
    subprocess.run([*cov, "combine", "-q", f"--rcfile={rc}"], cwd=out, check=True)
    report = subprocess.run(
        [*cov, "report", f"--rcfile={rc}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    (out / "report.txt").write_text(report.stdout + report.stderr)
    data = coverage.CoverageData(basename=str(out / ".coverage"))
    data.read()
    lines = unique_report(unique_lines(data))
    (out / "unique.txt").write_text("\n".join(lines) + "\n")
    total = next((ln for ln in report.stdout.splitlines() if ln.startswith("TOTAL")), "no TOTAL")
    print(f"coverage: {total}")
    print(f"coverage: {lines[0]}")
    print(f"coverage: the report, unique.txt and the data are in {out}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
