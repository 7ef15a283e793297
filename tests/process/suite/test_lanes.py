"""tests/lanes.py running one real pytest chunk: its counts and its failing tests read from
pytest's own output, and named again in the closing lines. (The chunks and the queue:
tests/unit/suite/test_lanes.py.)"""

from __future__ import annotations

from tests import lanes


def test_a_failing_test_is_named_again_in_the_closing_lines(tmp_path):
    """A CI log is read from its tail: the failing test's id and reason come last, after the
    chunk times and the CPU table, just above `total:`, not only thousands of lines up in the
    chunk's own output."""
    (tmp_path / "test_two.py").write_text(
        "def test_ok():\n    pass\n\n\ndef test_broken():\n    assert 1 + 1 == 3, 'arithmetic'\n"
    )
    chunk = lanes.Chunk("tiny", [str(tmp_path / "test_two.py"), "-ra", "-p", "no:cacheprovider"])
    runner = lanes.Runner([])
    runner.pytest(chunk)
    assert chunk.counts == {"failed": 1, "passed": 1} and chunk.failure == "exited 1"
    assert [ln.split(" - ")[0].split("::")[-1] for ln in chunk.failed_tests] == ["test_broken"]
    assert all(ln.startswith("FAILED ") for ln in chunk.failed_tests)
    ok = lanes.Chunk("fine", [], counts={"passed": 7})
    costs = [f"{n} CPU-s  tests/test_x.py::test_{n}" for n in range(30)]
    lines, rc = lanes.closing_lines([ok, chunk], costs, 12.0, 3)
    assert rc == 1
    # The tail a CI report shows (20 lines) ends with the failure, after the 30-line CPU table.
    assert lines[-1] == "total: 8 passed, 1 failed, 0 skipped"
    assert lines[-3] == "lanes: FAILED tiny exited 1"
    assert lines[-2].startswith("lanes: [tiny] FAILED ") and "test_broken" in lines[-2]
    assert "arithmetic" in lines[-2]
    assert lines.index("lanes: 12 s in all (wall), 3 lanes") == len(lines) - 4
