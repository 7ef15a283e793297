"""The image and the docker backend.

Tiers: lint and render checks (fast); the entrypoint against a fake torchrun (fast) and a
real 2-process torchrun on the host (slow); a real podman build and run of the image from a
locally made CPU base (container + slow, skipped where no engine can run it).

Here the tests on a real container engine (podman builds and runs the image); the in-process
ones in tests/unit/backends/test_docker.py, those that start processes in
tests/process/backends/test_docker.py. Helpers both use are in
tests/unit/backends/test_docker.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from argparse import Namespace

import pytest
from ddpkit.docker import backend as docker
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT

from tests import container_harness as harness
from tests.unit.backends.test_docker import _spec

container = pytest.mark.skipif(
    harness.skip_reason() is not None, reason=harness.skip_reason() or ""
)
TEST_IMAGE = "localhost/ddpkit:test"


@pytest.fixture(scope="module")
def image(launcher) -> str:
    t0 = time.monotonic()
    base, how = harness.ensure_base_image(log=lambda m: print(m, file=sys.stderr))
    t1 = time.monotonic()
    r = launcher(
        *("render", "docker", "--config", "configs/default.toml", "--set"),
        f"image={TEST_IMAGE}",
        *("--set", f"docker.kit_image={TEST_IMAGE}"),  # the kit image itself, no project layer
        *("--build", "--base-image", base),
        env=harness.engine_env(),
    )
    assert r.returncode == 0, r.stderr[-4000:]
    print(
        f"base image {base}: {how} in {t1 - t0:.0f} s; project image built in "
        f"{time.monotonic() - t1:.0f} s",
        file=sys.stderr,
    )
    return TEST_IMAGE


def _engine(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [harness.engine() or "podman", *args]
    if args and args[0] == "run":
        cmd = harness.adapt_run_argv(cmd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@container
@pytest.mark.container
@pytest.mark.slow
def test_image_is_non_root_labelled_and_answers_help(image):
    r = _engine("run", "--rm", "--entrypoint", "id", image, "-u")
    assert r.returncode == 0 and r.stdout.strip() not in ("", "0"), r.stderr
    r = _engine("run", "--rm", image, "--help")
    assert r.returncode == 0 and "--batch-size" in r.stdout, r.stderr
    # a launcher that runs its own command (pyxis, apptainer exec) from any directory
    r = _engine(
        "run",
        "--rm",
        "--workdir",
        "/tmp",
        image,
        "python",
        "-m",
        "ddpkit.train",
        "--print-config",
        "--steps",
        "3",
    )
    assert r.returncode == 0 and json.loads(r.stdout)["steps"] == 3, r.stderr
    r = _engine("image", "inspect", "--format", "{{json .Config}}", image)
    cfg = json.loads(r.stdout)
    labels = cfg["Labels"]
    for key in ("source", "version", "revision"):
        assert labels[f"org.opencontainers.image.{key}"], key
    # the commit it was built from (others may have committed since: it need not be HEAD)
    revision = labels["org.opencontainers.image.revision"].removesuffix("-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", revision), revision
    assert subprocess.run(["git", "cat-file", "-e", revision], cwd=REPO_ROOT).returncode == 0
    assert "PYTHONUNBUFFERED=1" in cfg["Env"]


@container
@pytest.mark.container
@pytest.mark.slow
def test_container_trains_is_preempted_and_resumes(image, tmp_path):
    """2 gloo ranks in the container, output on a host volume owned by the container user:
    `cancel` (docker stop) saves a checkpoint and exits 75; the same run resumes to the end."""
    out = tmp_path / "runs"
    out.mkdir()
    uid = int(_engine("run", "--rm", "--entrypoint", "id", image, "-u").stdout)
    if os.geteuid() == 0:  # the volume belongs to the container user, as make docker-run does
        os.chown(out, uid, uid)
    name = f"ddpkit-test-{os.getpid()}"
    sets = ["accelerator=cpu", f"image={image}", f"docker.out_dir={out}", f"name={name}"]
    common = ["--log-interval", "2", "--no-eval", "--ckpt-interval", "0"]
    spec = _spec(*sets, gpus=2, train_args=[*common, "--steps", "100000"])
    p = subprocess.Popen(
        harness.adapt_run_argv(docker.run_argv(spec)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        metrics = out / name / "metrics.jsonl"
        deadline = time.time() + 300  # a loaded CI machine
        while not metrics.exists() or not metrics.read_text().strip():
            if p.poll() is not None or time.time() > deadline:
                _engine("rm", "-f", name)  # never wait on a container that keeps training
                pytest.fail(f"no metrics: {p.communicate(timeout=120)[0][-3000:]}")
            time.sleep(0.5)
        # list: the running container carries the ddpkit label; logs: its output so far
        r = subprocess.run(
            [sys.executable, "-c", "import sys, argparse; from ddpkit.docker import backend as docker; "
             "sys.exit(docker.list_jobs(argparse.Namespace(engine=sys.argv[1])))", harness.engine()],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0 and r.stdout.startswith(f"{name}\t"), r.stdout + r.stderr
        r = subprocess.run(
            [sys.executable, "-m", "ddpkit.tools.submit", "logs", "docker", name, "--engine",
             harness.engine()], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0 and "ddpkit" in r.stdout + r.stderr, r.stderr
        assert docker.cancel(name, Namespace(spec=spec, engine=harness.engine())) == 0
        log, _ = p.communicate(timeout=120)
        assert p.returncode == 75, log[-3000:]
        saved = json.loads((out / name / "requeue.json").read_text())["step"]
        assert (out / name / "checkpoints" / f"step-{saved}" / ".complete").exists()
    finally:  # a failure above must not leave a container training 100,000 steps
        if p.poll() is None:
            _engine("rm", "-f", name)
            p.kill()

    spec = _spec(*sets, gpus=2, train_args=[*common, "--steps", str(saved + 4)])
    r = subprocess.run(
        harness.adapt_run_argv(docker.run_argv(spec)), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    summary = json.loads((out / name / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == saved + 4
    final = out / name / "checkpoints" / f"step-{saved + 4}"
    assert (final / ".complete").exists()
    assert final.stat().st_uid == uid != 0  # written by the non-root container user
    shutil.rmtree(out, ignore_errors=True)


@container
@pytest.mark.container
@pytest.mark.slow
def test_container_runs_torchft_groups_and_a_killed_group_rejoins(image, tmp_path):
    """fault_tolerance = "torchft" in the container: the lighthouse and 2 replica groups
    (one gloo rank each) inside it. Group 1's torchrun is SIGKILLed (`exec` in the running
    container): the supervisor starts it again while group 0 trains on, it heals from group 0,
    and both finish every step with equal parameters."""
    import threading

    out = tmp_path / "runs"
    out.mkdir()
    uid = int(_engine("run", "--rm", "--entrypoint", "id", image, "-u").stdout)
    if os.geteuid() == 0:
        os.chown(out, uid, uid)
    name = f"ddpkit-ft-{os.getpid()}"
    sets = [
        "accelerator=cpu", f"image={image}", f"docker.out_dir={out}", f"name={name}",
        "fault_tolerance=torchft", "replica_groups=2", "nproc_per_node=1",
        "env.TORCHFT_QUORUM_TIMEOUT_SEC=20",
        # 1 s a step, asleep (train/drills.py): 70 steps (a minute after the kill, as the local
        # torchft tests give) outlast group 1's restart without burning the cores as the
        # 30M-parameter mlp-deep did (31 machine CPU-s a run of 300 paced steps, not 187), and
        # the pace ends once group 1 healed: the test writes HEALED in the run dir
        # (DDPKIT_STEP_PACE_UNTIL, relative to the container's /workspace, where out_dir is
        # mounted as runs/). It was 200 steps of 0.3 s, the window sat out in full (76 s).
        "env.DDPKIT_STEP_PACE_S=1.0", f"env.DDPKIT_STEP_PACE_UNTIL=runs/{name}/healed",
    ]  # fmt: skip
    steps = 70
    train = ["--model", "mlp", "--batch-size", "16", "--steps", str(steps),
             "--log-interval", "5", "--no-eval", "--ckpt-interval", "35"]  # fmt: skip
    p = subprocess.Popen(
        harness.adapt_run_argv(docker.run_argv(_spec(*sets, train_args=train))),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()

    def wait_for(pattern: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not any(re.search(pattern, line) for line in list(lines)):
            if p.poll() is not None or time.time() > deadline:
                pytest.fail(f"no {pattern!r} (rc {p.poll()}):\n{''.join(lines)[-4000:]}")
            time.sleep(0.5)

    try:
        wait_for(r"^\[group 1\] step\s+10/", timeout=400)
        status = json.loads((out / name / "replica_groups.json").read_text())
        pid = status["groups"][1]["pid"]  # the container's own pid namespace
        r = _engine("exec", name, "python", "-c", f"import os; os.kill({pid}, 9)")
        killed = time.time()
        assert r.returncode == 0, r.stderr
        wait_for(r"^\[group 1\] torchft: replica group 1 healed", timeout=300)
        print(f"group 1 rejoined {time.time() - killed:.1f} s after its kill", file=sys.stderr)
        (out / name / "healed").write_text("")  # the window is no longer needed: unpaced
        rc = p.wait(timeout=600)
    finally:  # never leave a container training
        if p.poll() is None:
            _engine("rm", "-f", name)
            p.kill()
    log = "".join(lines)
    assert rc == 0, log[-4000:]
    status = json.loads((out / name / "replica_groups.json").read_text())
    assert [g["restarts"] for g in status["groups"]] == [0, 1], status
    assert status["groups"][1]["exits"][0] == -9, status
    survivor = [int(m.group(1)) for m in re.finditer(r"^\[group 0\] step\s+(\d+)/", log, re.M)]
    assert survivor == sorted(survivor) and survivor[-1] == steps  # never went back
    summaries = [
        json.loads((out / name / f"group-{g}" / "summary.json").read_text()) for g in (0, 1)
    ]
    assert [s["steps"] for s in summaries] == [steps, steps]
    assert summaries[0]["param_digest"] == summaries[1]["param_digest"]
    shutil.rmtree(out, ignore_errors=True)
