"""`make test`: the whole suite as two pytest runs side by side (lanes), every test once.

Why two lanes: the end-to-end tiers (a real SLURM cluster, podman, a real Kubernetes control
plane) spend much of their time waiting on daemons, queues and pods, while the rest of the
suite computes (torch processes on gloo). Run one after the other, the waits leave a core
idle; side by side, the other lane fills it. On a new machine the `k8s` step also waits for
k8s/local/build.sh (which .ci/run starts beside `make setup`): the Go build then overlaps
every other test instead of coming before them all.

    engines:   container, slurm  ->  k8s   (each step a pytest run; the k8s step last)
    processes: everything else

The lanes partition the suite by marker expression, built here from one list of engine
markers, so no test runs twice and none is left out (`--check` compares the ids each lane
collects with the whole suite's). Each lane's lines are printed as they come, prefixed with
the lane's name; the last line sums them up in the plain form CI reads
(`total: N passed, N failed, N skipped`). Extra arguments go to every pytest run
(`python -m tests.lanes --durations=30`), as does PYTEST_ADDOPTS.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The engine lane's steps, in order: each is a set of markers. k8s comes last so that a cold
# Go build has the longest time to finish before anything needs its binaries.
ENGINE_STEPS: list[tuple[str, ...]] = [("container", "slurm"), ("k8s",)]
ENGINE_MARKERS = [m for step in ENGINE_STEPS for m in step]


def lanes() -> dict[str, list[tuple[str, bool]]]:
    """Lane name -> its pytest runs in order, each (marker expression, whether it waits for a
    running k8s/local/build.sh first). A test carrying several engine markers belongs to the
    first step that names one of them."""
    engine_runs, before = [], []
    for step in ENGINE_STEPS:
        expr = " or ".join(step)
        if before:
            expr = f"({expr}) and not ({' or '.join(before)})"
        engine_runs.append((expr, "k8s" in step))
        before.extend(step)
    return {"engines": engine_runs, "processes": [(f"not ({' or '.join(ENGINE_MARKERS)})", False)]}


def k8s_build_lock() -> Path:
    out = subprocess.run(
        ["bash", "-c", f'source {ROOT}/k8s/local/versions.sh; echo "$DDPKIT_K8S_CACHE"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip()) / "build.lock"


def wait_for_k8s_build(say) -> None:
    """Block while k8s/local/build.sh holds its lock (a build is running); return at once when
    none is. The k8s tests skip, naming the build, when binaries are absent after it."""
    lock = k8s_build_lock()
    if not lock.exists():
        return
    with lock.open() as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            start = time.monotonic()
            say(f"waiting for the running k8s/local/build.sh ({lock})")
            fcntl.flock(f, fcntl.LOCK_SH)
            say(f"k8s/local/build.sh finished; waited {time.monotonic() - start:.0f} s")


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def summary_counts(line: str) -> dict[str, int]:
    """pytest's closing line (`== 3 failed, 80 passed, 2 skipped in 9.1s ==`) as counts."""
    counts: dict[str, int] = {}
    for n, word in _COUNT.findall(line):
        word = "errors" if word.startswith("error") else word
        counts[word] = counts.get(word, 0) + int(n)
    return counts


class Lane(threading.Thread):
    def __init__(
        self, name: str, runs: list[tuple[str, bool]], extra: list[str], out_lock: threading.Lock
    ):
        super().__init__(name=name)
        self.runs, self.extra, self.out_lock = runs, extra, out_lock
        self.counts: dict[str, int] = {}
        self.failed_runs: list[str] = []
        self.seconds = 0.0

    def say(self, line: str) -> None:
        with self.out_lock:
            print(f"[{self.name}] {line}", flush=True)

    def run(self) -> None:
        start = time.monotonic()
        for expr, waits_for_build in self.runs:
            if waits_for_build:
                wait_for_k8s_build(self.say)
            self.pytest(expr)
        self.seconds = time.monotonic() - start

    def pytest(self, expr: str) -> None:
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", expr, *self.extra]
        self.say(f"$ pytest -q -m {expr!r} {' '.join(self.extra)}".rstrip())
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        last_summary = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            self.say(line)
            if _COUNT.search(line) and (" in " in line or line.startswith("=")):
                last_summary = line
        rc = proc.wait()
        for key, n in summary_counts(last_summary).items():
            self.counts[key] = self.counts.get(key, 0) + n
        # 5: no test matched (a lane's step can be empty in a filtered run), not a failure.
        if rc not in (0, 5):
            self.failed_runs.append(f"-m {expr!r} exited {rc}")


def collected(expr: str | None, extra: list[str]) -> set[str]:
    args = ["-m", expr] if expr else []
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
         *args, *extra],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return {ln for ln in out.stdout.splitlines() if "::" in ln}


def check(extra: list[str]) -> int:
    """The lanes' collected test ids are disjoint and add up to the whole suite's."""
    whole = collected(None, extra)
    seen: set[str] = set()
    for name, runs in lanes().items():
        for expr, _ in runs:
            ids = collected(expr, extra)
            twice = seen & ids
            if twice:
                print(f"lanes: {len(twice)} tests in two lanes, e.g. {sorted(twice)[0]}")
                return 1
            seen |= ids
            print(f"lanes: {name} -m {expr!r}: {len(ids)} tests")
    missing = whole - seen
    if missing:
        print(f"lanes: {len(missing)} tests in no lane, e.g. {sorted(missing)[0]}")
        return 1
    print(f"lanes: every one of the {len(whole)} tests in exactly one lane")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        return check(argv[1:])
    out_lock = threading.Lock()
    runs = [Lane(name, steps, argv, out_lock) for name, steps in lanes().items()]
    start = time.monotonic()
    for lane in runs:
        lane.start()
    for lane in runs:
        lane.join()
    total: dict[str, int] = {}
    for lane in runs:
        for key, n in lane.counts.items():
            total[key] = total.get(key, 0) + n
        print(
            f"lanes: {lane.name} {lane.seconds:.0f} s: "
            + (", ".join(f"{n} {k}" for k, n in sorted(lane.counts.items())) or "no summary")
        )
    failures = [f"{lane.name}: {f}" for lane in runs for f in lane.failed_runs]
    for f in failures:
        print(f"lanes: FAILED {f}")
    print(f"lanes: {time.monotonic() - start:.0f} s in all (wall)")
    failed = total.get("failed", 0) + total.get("errors", 0)
    if failures and not failed:
        failed = len(failures)  # a run that died without a summary still fails the total
    print(
        f"total: {total.get('passed', 0)} passed, {failed} failed, {total.get('skipped', 0)} skipped"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
