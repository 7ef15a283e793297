"""`make test`'s lanes (tests/lanes.py): every test in exactly one lane, and the closing line
summed from the lanes' own."""

from __future__ import annotations

import itertools

from _pytest.mark.expression import Expression

from tests import lanes

MARKERS = ["slow", "gpu", *lanes.ENGINE_MARKERS]


def test_every_combination_of_markers_falls_in_exactly_one_lane_run():
    runs = [
        (name, Expression.compile(expr))
        for name, steps in lanes.lanes().items()
        for expr, _ in steps
    ]
    for n in range(len(MARKERS) + 1):
        for combo in itertools.combinations(MARKERS, n):
            marks = set(combo)
            hits = [name for name, e in runs if e.evaluate(lambda m, marks=marks: m in marks)]
            assert len(hits) == 1, (marks, hits)


def test_only_the_k8s_run_waits_for_the_go_build_and_it_comes_last_in_its_lane():
    engines = lanes.lanes()["engines"]
    assert [waits for _, waits in engines] == [False] * (len(engines) - 1) + [True]
    assert engines[-1][0].startswith("(k8s)")
    assert not any(waits for _, waits in lanes.lanes()["processes"])


def test_pytests_closing_line_is_read_as_counts():
    line = "== 2 failed, 830 passed, 2 skipped, 1 error, 12 deselected in 1800.21s (0:30:00) =="
    assert lanes.summary_counts(line) == {
        "failed": 2, "passed": 830, "skipped": 2, "errors": 1, "deselected": 12,
    }  # fmt: skip
    assert lanes.summary_counts("5 passed in 0.10s") == {"passed": 5}
