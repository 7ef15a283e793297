"""Each test's CPU (tests/testcost.py, listed by tests/lanes.py) and the coverage run's tagging
of measured lines by test (tests/coverage_run.py).

Here the tests that start processes; the in-process ones in tests/unit/suite/test_testcost.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import coverage
import pytest

from tests import coverage_run, testcost
from tests.trainrun import PY, ROOT

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_tests_cpu_counts_the_children_it_waited_for(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(testcost.CPU_DIR_ENV, str(tmp_path))
    body = testcost.measure("t.py::burns")
    next(body)
    subprocess.run([sys.executable, "-c", BURN.format(s=0.4)], check=True)
    with pytest.raises(StopIteration):
        next(body)
    [cost] = testcost.read_costs(tmp_path)
    assert cost.test == "t.py::burns"
    assert cost.cpu >= 0.35, cost  # the child's 0.4 CPU-s, waited for
    assert cost.wall >= 0.35


def test_a_pytest_run_of_the_suite_records_each_of_its_tests(tmp_path: Path):
    """Through the conftest hook: a real pytest run over two of tests/unit/suite/test_testcost.py's tests."""
    picked = [
        "tests/unit/suite/test_testcost.py::test_without_the_directory_nothing_is_recorded",
        "tests/unit/suite/test_testcost.py::test_the_table_lists_the_heaviest_first_and_sums_them_all",
    ]
    env = {**os.environ, testcost.CPU_DIR_ENV: str(tmp_path)}
    proc = subprocess.run(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *picked],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [
        json.loads(ln) for f in tmp_path.glob("*.jsonl") for ln in f.read_text().splitlines()
    ]
    assert sorted(r["test"] for r in records) == sorted(picked)
    assert all(r["cpu"] >= 0 and r["wall"] >= 0 for r in records)


def test_a_process_a_test_starts_is_measured_as_that_tests(tmp_path: Path):
    """The run's config with a real child interpreter per test: coverage starts through its
    .pth hook, takes the test from DDPKIT_COV_CONTEXT, and writes into the run's directory."""
    rc = tmp_path / "coveragerc"
    rc.write_text(coverage_run.rc_text(tmp_path))
    calls = {
        "t.py::pace": "from ddpkit.train import drills; drills.step_pace_s()",
        "t.py::parse": "from ddpkit.train import config; config.parse_config(['--steps', '3'])",
    }
    for test, code in calls.items():
        env = {**os.environ, "COVERAGE_PROCESS_START": str(rc), testcost.COV_CONTEXT_ENV: test}
        subprocess.run([PY, "-c", code], cwd=tmp_path, env=env, check=True, timeout=120)
    assert len(list(tmp_path.glob(".coverage.*"))) == 2
    subprocess.run(
        [PY, "-m", "coverage", "combine", "-q", f"--rcfile={rc}"], cwd=tmp_path, check=True
    )
    data = coverage.CoverageData(basename=str(tmp_path / ".coverage"))
    data.read()
    assert set(data.measured_contexts()) == set(calls)
    unique = coverage_run.unique_lines(data)
    assert unique["t.py::parse"] > unique["t.py::pace"] > 0
    drills = next(f for f in data.measured_files() if f.endswith("train/drills.py"))
    data.set_query_contexts(["t.py::pace"])
    assert data.lines(drills)
