"""Each test's CPU (tests/testcost.py, listed by tests/lanes.py) and the coverage run's tagging
of measured lines by test (tests/coverage_run.py).

Here the tests that run in this process; those that start processes in
tests/process/suite/test_testcost.py."""

from __future__ import annotations

from pathlib import Path

import coverage

from tests import coverage_run, testcost


def test_without_the_directory_nothing_is_recorded(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(testcost.CPU_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    for _ in testcost.measure("t.py::x"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_table_lists_the_heaviest_first_and_sums_them_all():
    costs = [testcost.TestCost(f"t::{n}", cpu, 1.0) for n, cpu in enumerate([3.0, 9.0, 1.0, 5.0])]
    lines = testcost.cost_table(costs, top=2)
    assert "18 CPU-s over 4 tests; the 2 heaviest" in lines[0]
    assert [ln.split()[-1] for ln in lines[1:]] == ["t::1", "t::3"]


def test_unique_lines_are_those_only_one_test_runs():
    data = coverage.CoverageData(no_disk=True)
    for context, lines in [
        ("", {"a.py": [1]}),  # collection: imports
        ("t::one", {"a.py": [1, 2, 3]}),
        ("t::two", {"a.py": [3, 4]}),
        ("t::three", {"a.py": [2, 3]}),
        ("static|t::four", {"b.py": [7]}),  # a pytest process: static and dynamic context
    ]:
        data.set_context(context)
        data.add_lines(lines)
    unique = coverage_run.unique_lines(data)
    assert unique == {"t::one": 0, "t::two": 1, "t::three": 0, "t::four": 1}
    report = coverage_run.unique_report(unique)
    assert report[0] == (
        "2 of the 4 tests that ran kit code run no measured line that no other test runs"
    )
    assert report[1].split() == ["0", "t::one"]
