"""`make test`'s chunks (tests/lanes.py): every test in exactly one chunk, and the closing line
summed from the chunks' own."""

from __future__ import annotations

import itertools

import pytest
from _pytest.mark.expression import Expression

from tests import lanes

MARKERS = ["slow", "gpu", *lanes.ENGINE_MARKERS]
PLACES = [
    *(f"tests/{f}/test_x.py" for f in lanes.FOLDERS),
    "tests/test_x.py",
    "tests/new/test_x.py",
    *(f"tests/{f}/{name}" for f, names in lanes.SPLIT.items() for name in names),
]


def selects(chunk: lanes.Chunk, path: str, marks: set[str]) -> bool:
    """What pytest does with the chunk's arguments: its paths, --ignore and -m."""
    args, paths, expr = list(chunk.args), [], None
    ignored = [a.split("=", 1)[1] for a in args if a.startswith("--ignore=")]
    while args:
        a = args.pop(0)
        if a == "-m":
            expr = args.pop(0)
        elif not a.startswith("-"):
            paths.append(a)
    under = lambda root: path == root or path.startswith(root + "/")  # noqa: E731
    if not any(under(p) for p in paths) or any(under(i) for i in ignored):
        return False
    return expr is None or Expression.compile(expr).evaluate(lambda m: m in marks)


def test_every_test_falls_in_exactly_one_chunk_wherever_it_is_and_however_marked():
    every = lanes.chunks()
    for path in PLACES:
        for n in range(len(MARKERS) + 1):
            for combo in itertools.combinations(MARKERS, n):
                hits = [c.name for c in every if selects(c, path, set(combo))]
                assert len(hits) == 1, (path, combo, hits)


def test_only_the_s3_and_k8s_chunks_wait_for_their_go_builds_and_the_queue_keeps_order():
    every = lanes.chunks()
    assert {c.name: c.waits_for_build for c in every if c.waits_for_build} == {
        "s3": "s3", "k8s": "k8s",
    }  # fmt: skip
    assert [c.name for c in every] == [n for n in lanes.ORDER if n in {c.name for c in every}]
    assert all(lanes.build_lock(b).name == "build.lock" for b in lanes.BUILDS)


def taken(running: set[str]) -> list[str]:
    """The order in which free lanes take the chunks while the builds in `running` run."""
    todo, out = lanes.chunks(), []
    while (chunk := lanes.take(todo, running=lambda build: build in running)) is not None:
        out.append(chunk.name)
    return out


def test_a_free_lane_takes_the_longest_chunk_and_puts_off_one_whose_build_still_runs():
    warm = taken(set())
    assert warm == [c.name for c in lanes.chunks()] and warm[0] != "k8s"
    assert warm.index("k8s") < len(warm) - 2  # warm: the k8s chunk is not held back
    # A new machine: both Go builds still running, so their chunks go last, k8s (longer) first.
    cold = taken({"k8s", "s3"})
    assert cold[-2:] == ["k8s", "s3"]
    assert [n for n in cold if n not in ("k8s", "s3")] == [
        n for n in warm if n not in ("k8s", "s3")
    ]
    # The S3 server built, the control plane not yet: s3 keeps its place, k8s goes last.
    assert taken({"k8s"}) == [n for n in warm if n != "k8s"] + ["k8s"]
    assert lanes.take([], running=lambda build: True) is None


def test_pytests_closing_line_is_read_as_counts():
    line = "== 2 failed, 830 passed, 2 skipped, 1 error, 12 deselected in 1800.21s (0:30:00) =="
    assert lanes.summary_counts(line) == {
        "failed": 2, "passed": 830, "skipped": 2, "errors": 1, "deselected": 12,
    }  # fmt: skip
    assert lanes.summary_counts("5 passed in 0.10s") == {"passed": 5}


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


def test_the_lane_count_is_lanes_unless_a_whole_number_is_given():
    assert lanes.lane_count("") == lanes.LANES == 3
    assert lanes.lane_count(" 2 ") == 2
    for bad in ("0", "three", "-1", "9", "2.5"):
        with pytest.raises(ValueError, match="DDPKIT_TEST_LANES=.* is not a lane count: give 1"):
            lanes.lane_count(bad)


def test_a_bad_lane_count_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv(lanes.LANES_ENV, "many")
    assert lanes.main([]) == 2
    assert capsys.readouterr().err == (
        "error: DDPKIT_TEST_LANES='many' is not a lane count: give 1 to 8, or unset it\n"
    )
