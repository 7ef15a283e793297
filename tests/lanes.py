"""`make test`: the whole suite as a queue of pytest runs (chunks) that three lanes work through
side by side, every test in exactly one chunk.

Why: the end-to-end tiers (a real SLURM cluster, podman, a real Kubernetes control plane) spend
much of their time waiting on daemons, queues and pods, and even the multi-process tests leave
a core idle while processes start, rendezvous and wait on each other (one pytest run kept the
2 cores 50-60% busy). Runs side by side fill that idle time: two lanes kept the cores 73% busy
once the drills paced their steps asleep, three 97% (LANES). A new machine builds the Go
binaries (k8s/local/build.sh, tools/s3local/build.sh, started by .ci/run beside `make setup`):
while a build runs, its chunk waits behind every other, so the build overlaps them instead of
coming before them all (`take`).

The chunks are the test folders (docs/development.md, "Tiers"); no list names a file and no
marker decides a chunk:

    unit              tests/unit, the whole tier in one run (in-process tests, under a minute)
    process/<area>    each folder under tests/process that holds test files, without the
    engines/<engine>  ... folders under it that are chunks of their own; the same under
                      tests/engines (engines/k8s waits for k8s/local/build.sh's lock,
                      engines/s3 for tools/s3local/build.sh's)
    rest              test files outside the three tiers, if any

The queue is longest first by the chunk times of the last measured run (SECONDS); a chunk not
in it (a new folder) goes first, as if it were the longest, so it never ends a run alone. A
chunk is whole test files, so module fixtures (a trained run, a built image) are set up once;
the only session fixture, the SLURM cluster, is used by tests/engines/slurm alone (and
tests/unit/suite/test_lanes.py checks that an engine's marker is only found in its folder).
`--check` collects each chunk and shows that they are disjoint and add up to the whole suite.
Each chunk's lines are printed as they come, prefixed with its name; the last line sums them up
in the plain form CI reads (`total: N passed, N failed, N skipped`). Extra arguments go to every
pytest run (`python -m tests.lanes --durations=30`), as does PYTEST_ADDOPTS. Before the total it
lists the tests that took the most CPU (tests/testcost.py): on 2 cores the suite is CPU-bound,
so that, not a test's wall time, is what it takes from the other lane.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import testcost

ROOT = Path(__file__).resolve().parents[1]
LANES_ENV = "DDPKIT_TEST_LANES"  # another lane count, to measure one: DDPKIT_TEST_LANES=2 make test
# Three on the 2 cores: the same fresh-clone CI run on the same warm machine took 2,025 and 2,071 s
# with two lanes (the cores 73% busy) and 1,818 s with three (97% busy), every test passing
# (2026-12-05, docs/development.md). More would only add contention: the cores are full.
LANES = 3
CPU_TOP = 30  # the heaviest tests by CPU, listed at the end (tests/testcost.py)
TIERS = ("unit", "process", "engines")
WHOLE = ("unit",)  # tiers run as one chunk, subfolders and all
# The Go builds .ci/run starts in the background: build -> its versions.sh (it names the cache
# whose build.lock the build holds); and the chunks that wait for one.
BUILDS = {"s3": "tools/s3local/versions.sh", "k8s": "k8s/local/versions.sh"}
WAITS = {"engines/k8s": "k8s", "engines/s3": "s3"}
# Each chunk's seconds in the last measured run (three lanes; docs/development.md, "Where the
# time goes"): the queue takes the longest first, so the lanes end close together. Update them
# from a run's closing lines (`lanes: <chunk> N s`) when the chunks change much.
SECONDS: dict[str, float] = {
    "engines/slurm": 850, "process/launch": 800, "process/train": 700, "engines/k8s": 600,
    "process/train/ckpt": 500, "process/tools": 400, "process/train/loop": 300,
    "process/backends": 250, "process/train/data": 200, "engines/container": 200,
    "engines/s3": 160, "process/bench": 150, "unit": 45, "process/suite": 30,
    "engines/gpu": 5, "rest": 5,
}  # fmt: skip


@dataclass
class Chunk:
    name: str
    args: list[str]  # pytest's selection: paths and --ignore
    waits_for_build: str = ""  # "k8s" / "s3": the Go build (BUILDS) this chunk waits for
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    failure: str = ""
    failed_tests: list[str] = field(default_factory=list)  # pytest's `FAILED id - why` lines


TEST_FILES = ("test_*.py", "*_test.py")  # pytest's python_files


def holds_tests(folder: Path) -> bool:
    """Whether test files lie directly in `folder`."""
    return any(any(folder.glob(pattern)) for pattern in TEST_FILES)


def files_of(folder: Path) -> list[Path]:
    """The test files in `folder` and below it."""
    return sorted(p for pattern in TEST_FILES for p in folder.rglob(pattern))


def chunk_folders(tests: Path) -> list[Path]:
    """The folders that are chunks: each whole tier of WHOLE, and under the other tiers every
    folder holding test files (a tier's own folder too, for files put directly in it)."""
    out = [tests / t for t in WHOLE if files_of(tests / t)]
    for tier in TIERS:
        if tier not in WHOLE and (tests / tier).is_dir():
            folders = [tests / tier, *sorted(p for p in (tests / tier).rglob("*") if p.is_dir())]
            out += [f for f in folders if "__pycache__" not in f.parts and holds_tests(f)]
    return out


def chunks(root: Path = ROOT) -> list[Chunk]:
    """The queue: one chunk per chunk folder (without the chunk folders below it), `rest` for
    test files outside the tiers; longest first by SECONDS, a chunk it does not name first."""
    tests = root / "tests"
    folders = chunk_folders(tests)
    out = []
    for f in folders:
        name = f.relative_to(tests).as_posix()
        below = [g for g in folders if f in g.parents]
        below = [g for g in below if not any(h in g.parents for h in below)]  # the topmost
        args = [
            f"tests/{name}",
            *(f"--ignore=tests/{g.relative_to(tests).as_posix()}" for g in below),
        ]
        out.append(Chunk(name, args, WAITS.get(name, "")))
    elsewhere = [p for p in files_of(tests) if p.relative_to(tests).parts[0] not in TIERS]
    if elsewhere:
        out.append(Chunk("rest", ["tests", *(f"--ignore=tests/{t}" for t in TIERS)]))
    return sorted(out, key=lambda c: (-SECONDS.get(c.name, float("inf")), c.name))


def build_running(build: str) -> bool:
    """Whether the build's script holds its lock now (it is building)."""
    lock = build_lock(build)
    if not lock.exists():
        return False
    with lock.open() as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def take(todo: list[Chunk], running=build_running) -> Chunk | None:
    """The next chunk for a free lane: the first in the queue that is not waiting for a running
    Go build; when only such chunks are left, the first of them (the lane then waits for its
    build). On a warm machine that is the queue's own order, longest first; on a new one the
    k8s and s3 chunks go after everything else, so their builds overlap the other tests."""
    if not todo:
        return None
    for i, chunk in enumerate(todo):
        if not chunk.waits_for_build or not running(chunk.waits_for_build):
            return todo.pop(i)
    return todo.pop(0)


@functools.cache  # a bash run per call; take() asks at every free lane
def build_lock(build: str) -> Path:
    cache = {"k8s": "DDPKIT_K8S_CACHE", "s3": "DDPKIT_S3_CACHE"}[build]
    out = subprocess.run(
        ["bash", "-c", f'source {ROOT}/{BUILDS[build]}; echo "${cache}"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip()) / "build.lock"


def wait_for_build(build: str, say) -> None:
    """Block while the build's script (k8s/local/build.sh, tools/s3local/build.sh) holds its
    lock (a build is running); return at once when none is. The tests then find the binaries,
    or build them (s3) or skip naming the build (k8s)."""
    if not build_running(build):
        return
    script = str(Path(BUILDS[build]).with_name("build.sh"))
    lock = build_lock(build)
    start = time.monotonic()
    say(f"waiting for the running {script} ({lock})")
    with lock.open() as f:
        fcntl.flock(f, fcntl.LOCK_SH)
    say(f"{script} finished; waited {time.monotonic() - start:.0f} s")


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def summary_counts(line: str) -> dict[str, int]:
    """pytest's closing line (`== 3 failed, 80 passed, 2 skipped in 9.1s ==`) as counts."""
    counts: dict[str, int] = {}
    for n, word in _COUNT.findall(line):
        word = "errors" if word.startswith("error") else word
        counts[word] = counts.get(word, 0) + int(n)
    return counts


class Runner:
    def __init__(self, extra: list[str]):
        self.extra = extra
        self.out_lock = threading.Lock()
        self.todo_lock = threading.Lock()

    def say(self, name: str, line: str) -> None:
        with self.out_lock:
            print(f"[{name}] {line}", flush=True)

    def lane(self, todo: list[Chunk]) -> None:
        while True:
            with self.todo_lock:
                chunk = take(todo)
            if chunk is None:
                return
            if chunk.waits_for_build:
                wait_for_build(chunk.waits_for_build, lambda line, c=chunk: self.say(c.name, line))
            self.pytest(chunk)

    def pytest(self, chunk: Chunk) -> None:
        start = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", "-q", *chunk.args, *self.extra]
        self.say(chunk.name, "$ pytest -q " + " ".join(chunk.args + self.extra))
        # pytest cuts a `FAILED id - why` line at the terminal's width, and a test id alone fills
        # 80 columns, unless it runs on CI (the CI variable): then the reason stays.
        env = {**os.environ, "CI": os.environ.get("CI") or "true"}
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1,
        )  # fmt: skip
        last_summary = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            self.say(chunk.name, line)
            if _COUNT.search(line) and (" in " in line or line.startswith("=")):
                last_summary = line
            if line.startswith(("FAILED ", "ERROR ")):
                chunk.failed_tests.append(line)
        rc = proc.wait()
        chunk.counts = summary_counts(last_summary)
        chunk.seconds = time.monotonic() - start
        # 5: no test selected (a chunk can be empty in a filtered run), not a failure.
        if rc not in (0, 5):
            chunk.failure = f"exited {rc}"


def collected(args: list[str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *args],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return {ln for ln in out.stdout.splitlines() if "::" in ln}


def check(extra: list[str]) -> int:
    """The chunks' collected test ids are disjoint and add up to the whole suite's."""
    whole = collected(["tests", *extra])
    seen: set[str] = set()
    for chunk in chunks():
        ids = collected([*chunk.args, *extra])
        twice = seen & ids
        if twice:
            print(f"lanes: {len(twice)} tests in two chunks, e.g. {sorted(twice)[0]}")
            return 1
        seen |= ids
        print(f"lanes: {chunk.name}: {len(ids)} tests")
    missing = whole - seen
    if missing:
        print(f"lanes: {len(missing)} tests in no chunk, e.g. {sorted(missing)[0]}")
        return 1
    print(f"lanes: every one of the {len(whole)} tests in exactly one chunk")
    return 0


def lane_count(raw: str) -> int:
    """LANES, or DDPKIT_TEST_LANES when it names a whole number from 1 to 8."""
    if not raw.strip():
        return LANES
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 8:
        raise ValueError(f"{LANES_ENV}={raw!r} is not a lane count: give 1 to 8, or unset it")
    return int(raw)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        return check(argv[1:])
    try:
        lanes = lane_count(os.environ.get(LANES_ENV, ""))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runner = Runner(argv)
    every = chunks()
    cpu_dir = tempfile.TemporaryDirectory(prefix="ddpkit-testcpu-")
    os.environ[testcost.CPU_DIR_ENV] = cpu_dir.name  # each pytest run records its tests' CPU
    todo = list(every)
    start = time.monotonic()
    threads = [threading.Thread(target=runner.lane, args=(todo,)) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    costs = testcost.cost_table(testcost.read_costs(Path(cpu_dir.name)), CPU_TOP)
    cpu_dir.cleanup()
    lines, rc = closing_lines(every, costs, time.monotonic() - start, lanes)
    print("\n".join(lines))
    return rc


def closing_lines(
    every: list[Chunk], costs: list[str], seconds: float, lanes: int
) -> tuple[list[str], int]:
    """The run's closing lines and exit status. A CI log is read from its tail, so the failing
    tests come last, just above `total:` (their tracebacks are far above, under the chunk's
    name), after the chunk times and the CPU table."""
    lines, total = [], {}
    for chunk in every:
        for key, n in chunk.counts.items():
            total[key] = total.get(key, 0) + n
        counts = ", ".join(f"{n} {k}" for k, n in sorted(chunk.counts.items())) or "no summary"
        lines.append(f"lanes: {chunk.name} {chunk.seconds:.0f} s: {counts}")
    # Where the CPU goes: the suite is CPU-bound, so this, not wall time, is what a lane takes
    # from the other (docs/development.md).
    lines += [f"lanes: {line}" for line in costs]
    lines.append(f"lanes: {seconds:.0f} s in all (wall), {lanes} lanes")
    failures = [f"{c.name} {c.failure}" for c in every if c.failure]
    lines += [f"lanes: FAILED {f}" for f in failures]
    lines += [f"lanes: [{c.name}] {line[:400]}" for c in every for line in c.failed_tests]
    failed = total.get("failed", 0) + total.get("errors", 0)
    if failures and not failed:
        failed = len(failures)  # a run that died without a summary still fails the total
    lines.append(
        f"total: {total.get('passed', 0)} passed, {failed} failed, {total.get('skipped', 0)} skipped"
    )
    return lines, 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
