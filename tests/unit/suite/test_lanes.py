"""`make test`'s chunks (tests/lanes.py): the test folders, every test file in exactly one chunk
wherever it is put, the queue longest first, and the closing line summed from the chunks'
own. (Its run of a real pytest chunk is in tests/process/suite/test_lanes.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import lanes

# Where a test with each engine marker must live: the SLURM cluster is a session fixture, so
# its tests are in one chunk; the same for the image the container tests build, and the
# Kubernetes and S3 servers.
ENGINES = ("slurm", "k8s", "container", "s3", "gpu")

PLACES = [
    "unit/test_a.py", "unit/train/ckpt/test_b.py", "unit/deep/er/x_test.py",
    "process/test_c.py", "process/train/test_d.py", "process/train/ckpt/test_e.py",
    "process/train/x/y/test_f.py", "process/tools/test_g.py",
    "engines/slurm/test_h.py", "engines/k8s/test_i.py", "engines/s3/test_j.py",
    "engines/test_k.py", "test_top.py", "other/test_l.py", "other/deep/test_m.py",
]  # fmt: skip


def selects(chunk: lanes.Chunk, path: str) -> bool:
    """What pytest does with the chunk's arguments: its paths and --ignore."""
    paths = [a for a in chunk.args if not a.startswith("-")]
    ignored = [a.split("=", 1)[1] for a in chunk.args if a.startswith("--ignore=")]
    under = lambda root: path == root or path.startswith(root + "/")  # noqa: E731
    return any(under(p) for p in paths) and not any(under(i) for i in ignored)


def tree(root: Path, places: list[str]) -> Path:
    for place in places:
        (root / "tests" / place).parent.mkdir(parents=True, exist_ok=True)
        (root / "tests" / place).write_text("def test_x():\n    pass\n")
    (root / "tests" / "process" / "empty").mkdir()  # a folder without tests is no chunk
    (root / "tests" / "process" / "empty" / "helpers.py").write_text("")
    return root


def test_every_test_file_falls_in_exactly_one_chunk_wherever_it_is_put(tmp_path):
    every = lanes.chunks(tree(tmp_path, PLACES))
    for place in PLACES:
        hits = [c.name for c in every if selects(c, f"tests/{place}")]
        assert len(hits) == 1, (place, hits)
    assert sorted(c.name for c in every) == sorted([
        "unit", "process", "process/train", "process/train/ckpt", "process/train/x/y",
        "process/tools", "engines", "engines/slurm", "engines/k8s", "engines/s3", "rest",
    ])  # fmt: skip
    # a chunk folder leaves out only the chunk folders right below it
    (train,) = [c for c in every if c.name == "process/train"]
    assert train.args == [
        "tests/process/train", "--ignore=tests/process/train/ckpt",
        "--ignore=tests/process/train/x/y",
    ]  # fmt: skip
    # without files outside the tiers there is no `rest` chunk to start
    assert "rest" not in {c.name for c in lanes.chunks(tree(tmp_path / "b", PLACES[:12]))}


def test_the_suites_own_files_each_fall_in_exactly_one_chunk():
    every = lanes.chunks()
    for path in lanes.files_of(lanes.ROOT / "tests"):
        rel = path.relative_to(lanes.ROOT).as_posix()
        hits = [c.name for c in every if selects(c, rel)]
        assert len(hits) == 1, (rel, hits)


def test_the_queue_is_longest_first_and_a_chunk_of_unknown_length_goes_first(tmp_path):
    every = lanes.chunks(tree(tmp_path, PLACES))
    names = [c.name for c in every]
    unknown = [n for n in names if n not in lanes.SECONDS]  # as if the longest
    assert "process/train/x/y" in unknown and names[: len(unknown)] == sorted(unknown)
    known = [n for n in names if n in lanes.SECONDS]
    assert known == sorted(known, key=lambda n: -lanes.SECONDS[n])
    assert names.index("engines/slurm") < names.index("unit")


def test_only_the_k8s_and_s3_engines_wait_for_their_go_builds():
    every = lanes.chunks()
    assert {c.name: c.waits_for_build for c in every if c.waits_for_build} == {
        "engines/s3": "s3", "engines/k8s": "k8s",
    }  # fmt: skip
    assert all(lanes.build_lock(b).name == "build.lock" for b in lanes.BUILDS)


def taken(running: set[str]) -> list[str]:
    """The order in which free lanes take the chunks while the builds in `running` run."""
    todo, out = lanes.chunks(), []
    while (chunk := lanes.take(todo, running=lambda build: build in running)) is not None:
        out.append(chunk.name)
    return out


def test_a_free_lane_takes_the_longest_chunk_and_puts_off_one_whose_build_still_runs():
    warm = taken(set())
    assert warm == [c.name for c in lanes.chunks()] and warm[0] != "engines/k8s"
    assert warm.index("engines/k8s") < len(warm) - 2  # warm: the k8s chunk is not held back
    # A new machine: both Go builds still running, so their chunks go last, k8s (longer) first.
    cold = taken({"k8s", "s3"})
    assert cold[-2:] == ["engines/k8s", "engines/s3"]
    waiting = ("engines/k8s", "engines/s3")
    assert [n for n in cold if n not in waiting] == [n for n in warm if n not in waiting]
    # The S3 server built, the control plane not yet: s3 keeps its place, k8s goes last.
    assert taken({"k8s"}) == [n for n in warm if n != "engines/k8s"] + ["engines/k8s"]
    assert lanes.take([], running=lambda build: True) is None


def marks(path: Path) -> dict[str, set[str]]:
    """Each test function's markers in a test file, read from its source: the module's
    pytestmark, its class's and its own decorators (pytest.param's marks included), and names
    bound to a mark at the module's top."""
    body = ast.parse(path.read_text()).body

    def named(node: ast.AST) -> set[str]:
        out = set()
        for n in ast.walk(node):
            mark = isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
            if mark and n.value.attr == "mark":
                out.add(n.attr)
            if isinstance(n, ast.Name) and n.id in aliases:
                out |= aliases[n.id]
        return out

    aliases: dict[str, set[str]] = {}
    module: set[str] = set()
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and (found := named(node.value)):
                if target.id == "pytestmark":
                    module |= found
                else:
                    aliases[target.id] = found
    out = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            out[node.name] = module | set().union(*map(named, node.decorator_list))
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            own = module | set().union(*map(named, node.decorator_list))
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test"):
                    out[f"{node.name}.{f.name}"] = own | set().union(*map(named, f.decorator_list))
    return out


def test_markers_agree_with_the_folders():
    """The lanes read folders, never markers; markers stay for whoever selects by them
    (`pytest -m slurm`, bench/gpu_check.sh's `-m gpu`). So the folders must say what the markers
    say: every test file is in a tier, no unit test is slow or needs an engine, and a test that
    needs an engine lives in that engine's folder (an S3 test may live in the SLURM or Kubernetes folder, whose jobs use the
    store), so each engine's session fixture is set up by one chunk."""
    wrong = []
    for path in lanes.files_of(lanes.ROOT / "tests"):
        parts = path.relative_to(lanes.ROOT / "tests").parts
        if parts[0] not in lanes.TIERS:
            wrong.append(f"{'/'.join(parts)}: outside tests/unit, tests/process, tests/engines")
            continue
        for test, found in marks(path).items():
            where = f"{'/'.join(parts)}::{test} {sorted(found)}"
            if parts[0] == "unit" and found & {"slow", *ENGINES}:
                wrong.append(where)
            engines = found & set(ENGINES)
            home = parts[1] if parts[0] == "engines" and len(parts) > 2 else None
            if engines and home not in engines:
                wrong.append(where)
            if home and home not in found:
                wrong.append(where)
    assert wrong == []


def test_pytests_closing_line_is_read_as_counts():
    line = "== 2 failed, 830 passed, 2 skipped, 1 error, 12 deselected in 1800.21s (0:30:00) =="
    assert lanes.summary_counts(line) == {
        "failed": 2, "passed": 830, "skipped": 2, "errors": 1, "deselected": 12,
    }  # fmt: skip
    assert lanes.summary_counts("5 passed in 0.10s") == {"passed": 5}


def test_a_failing_chunks_tests_come_last_just_above_the_total():
    """A CI log is read from its tail: the failing test's id and reason come last, after the
    chunk times and the CPU table, just above `total:`, not only thousands of lines up in the
    chunk's own output."""
    bad = lanes.Chunk(
        "tiny", [], counts={"failed": 1, "passed": 1}, failure="exited 1",
        failed_tests=["FAILED tests/test_two.py::test_broken - AssertionError: arithmetic"],
    )  # fmt: skip
    ok = lanes.Chunk("fine", [], counts={"passed": 7})
    costs = [f"{n} CPU-s  tests/test_x.py::test_{n}" for n in range(30)]
    lines, rc = lanes.closing_lines([ok, bad], costs, 12.0, 3)
    assert rc == 1
    # The tail a CI report shows (20 lines) ends with the failure, after the 30-line CPU table.
    assert lines[-1] == "total: 8 passed, 1 failed, 0 skipped"
    assert lines[-3] == "lanes: FAILED tiny exited 1"
    assert lines[-2] == f"lanes: [tiny] {bad.failed_tests[0]}"
    assert lines.index("lanes: 12 s in all (wall), 3 lanes") == len(lines) - 4
    assert lines[0] == "lanes: fine 0 s: 7 passed"


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
