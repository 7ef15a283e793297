"""The image and the docker backend.

Tiers: lint and render checks (fast); the entrypoint against a fake torchrun (fast) and a
real 2-process torchrun on the host (slow); a real podman build and run of the image from a
locally made CPU base (container + slow, skipped where no engine can run it).

Here the tests that start processes; the in-process ones in tests/unit/backends/test_docker.py,
those on a real container engine (podman builds and runs the image) in
tests/engines/container/test_docker.py. Helpers both use are in
tests/unit/backends/test_docker.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from ddpkit.docker import backend as docker
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT

from tests.unit.backends.test_docker import (
    DOCKERFILE,
    RECORDING_ENGINE,
    VENV_BIN,
    _entrypoint,
    _finish,
    _node_args,
    _spec,
)


def test_the_image_context_holds_the_dockerfile_entrypoint_configs_and_the_wheel(tmp_path):
    """The kit image is built from a staged context, never the checkout or the workspace:
    what the Dockerfile copies is there, and the wheel holds only the ddpkit namespace."""
    docker.stage_kit_context(tmp_path / "ctx")
    ctx = tmp_path / "ctx"
    staged = {p.relative_to(ctx).as_posix() for p in ctx.rglob("*") if p.is_file()}
    wheels = [p for p in staged if p.startswith("wheels/")]
    assert len(wheels) == 1 and wheels[0].endswith(".whl")
    assert {"docker/Dockerfile", "docker/entrypoint.sh", "configs/default.toml"} <= staged
    assert not any(p.startswith(("runs/", ".venv", "tests/", "bench/")) for p in staged)
    for src in re.findall(r"^COPY (\S+)", DOCKERFILE.read_text(), re.M):
        assert (ctx / src).exists(), src
    import zipfile

    tops = {n.split("/")[0] for n in zipfile.ZipFile(ctx / wheels[0]).namelist()}
    assert tops == {"ddpkit", next(t for t in tops if t.endswith(".dist-info"))}


def test_the_image_installs_the_s3_and_ft_extras(tmp_path):
    """ckpt_dir = "s3://..." needs fsspec + s3fs on the nodes, fault_tolerance = "torchft"
    torchft: the context stages the kit's own `s3` and `ft` extras (pyproject.toml, one home)
    and their wheels for this Python when pip can get them, never torch (the base image's;
    torchft depends on it), and the Dockerfile installs them, then fails the build unless
    fsspec serves s3:// and torchft imports (the staged wheels installed with --network none
    in the test image: checked by hand)."""
    import tomllib

    docker.stage_kit_context(tmp_path / "ctx")
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    want = extra["optional-dependencies"]["s3"] + extra["optional-dependencies"]["ft"]
    plain = (tmp_path / "ctx" / "docker" / "node-requirements.txt").read_text().splitlines()
    bare = (tmp_path / "ctx" / "docker" / "node-requirements-nodeps.txt").read_text().splitlines()
    assert set(want) <= set(plain + bare) and len(plain + bare) == len(set(plain + bare))
    if bare:  # torchft's wheel came (its dependencies read from it): no torch reinstalled
        assert bare == [r for r in want if r.startswith("torchft")]
        assert any(r.startswith("opentelemetry-sdk") for r in plain)
    assert not [r for r in plain if re.match(r"(torch|numpy)\b", r)], plain
    text = DOCKERFILE.read_text()
    assert "COPY docker/node-requirements.txt docker/node-requirements-nodeps.txt /tmp/" in text
    assert "--no-deps -r /tmp/node-requirements-nodeps.txt" in text
    assert "COPY node-wheels/ /tmp/node-wheels/" in text  # offline first, then the index
    assert "--no-index --find-links /tmp/node-wheels" in text
    wheels = {p.name.split("-")[0] for p in (tmp_path / "ctx" / "node-wheels").glob("*.whl")}
    assert not wheels or {"s3fs", "fsspec", "aiobotocore"} <= wheels  # best effort: offline
    assert not wheels or {"torchft", "opentelemetry_sdk"} <= wheels
    assert not {"torch", "numpy"} & wheels and not any(w.startswith("nvidia") for w in wheels)
    assert """fsspec.filesystem("s3"); import torchft""" in text
    # before the kit's wheel: a new kit revision reuses the installed extras' layer
    assert text.index("node-requirements") < text.index("COPY wheels/")


def _kit_files() -> dict[str, int]:
    skip = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
    return {
        str(p.relative_to(REPO_ROOT)): p.stat().st_mtime_ns
        for p in REPO_ROOT.rglob("*")
        if not skip & set(p.relative_to(REPO_ROOT).parts)
    }


def test_ddpkit_build_writes_nothing_into_the_kits_checkout(fake_bin, tmp_path):
    """`ddpkit build` from a user's project with the kit installed from its checkout: the
    wheel is built from a copy (setuptools leaves build/ and ddpkit.egg-info beside what it
    builds), and the kit's files stay as they were."""
    if not (REPO_ROOT / "pyproject.toml").is_file():
        pytest.skip("the kit is installed from a wheel here: no checkout to write into")
    fake_bin.add("docker", RECORDING_ENGINE)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "ddpkit.toml").write_text('name = "proj"\nimage = "proj:1"\nscript = "train.py"\n')
    before = _kit_files()
    r = subprocess.run([str(VENV_BIN / "ddpkit"), "build"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    builds = [json.loads(a) for a in (fake_bin.path / "docker.log").read_text().splitlines()]
    assert [a[0] for a in builds if a[0] == "build"] == ["build", "build"], builds
    after = _kit_files()
    assert sorted(set(after) - set(before)) == []
    assert [f for f in before if after.get(f) != before[f]] == []


def test_make_docker_run_asks_for_the_gpus_there_are(fake_bin, tmp_path):
    """Without GPUS: every visible GPU (`--gpus all`) where nvidia-smi sees one, else the CPU
    (no GPU flag, gloo), said in one line; GPUS=2: two. Records land in the workspace."""
    fake_bin.add("docker", RECORDING_ENGINE)
    runs = []
    for extra, gpu in (([], True), (["GPUS=2"], True), ([], False)):
        fake_bin.add("nvidia-smi", "#!/bin/sh\nexit 0\n" if gpu else "#!/bin/sh\nexit 9\n")
        r = subprocess.run(["make", "-s", "-f", str(REPO_ROOT / "Makefile"), "docker-run",
                            *extra, "ARGS=--steps 1"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        log = [json.loads(line) for line in (fake_bin.path / "docker.log").read_text().splitlines()]
        runs.append([a for a in log if a[0] == "run"][-1])
        if not gpu:
            assert "no GPU visible here; the container runs on the CPU" in r.stderr
    assert [a[a.index("--gpus") + 1] for a in runs[:2]] == ["all", "2"]
    assert "--gpus" not in runs[2] and "--device" not in runs[2]
    assert not [a for a in runs[0] if a.startswith("PET_NPROC_PER_NODE")]
    assert "PET_NPROC_PER_NODE=2" in runs[1]
    assert (tmp_path / ".ddpkit" / "jobs" / "docker" / "last_job.json").is_file()


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_submit_without_gpus_runs_on_the_cpu_and_says_so(engine, fake_bin, launcher, tmp_path):
    """`ddpkit submit docker` where nvidia-smi sees no GPU: no GPU flag or CDI device (podman
    refused nvidia.com/gpu=0 with exit 126), the processes on the CPU, one line saying so;
    where it sees one, the GPUs as rendered."""
    fake_bin.add(engine, RECORDING_ENGINE)
    runs, notes = [], []
    for gpu in (False, True):
        fake_bin.add("nvidia-smi", "#!/bin/sh\nexit 0\n" if gpu else "#!/bin/sh\nexit 9\n")
        r = launcher("submit", "docker", "--engine", engine, "--gpus", "2", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        log = (fake_bin.path / f"{engine}.log").read_text().splitlines()
        runs.append([a for a in map(json.loads, log) if a[0] == "run"][-1])
        notes.append([line for line in r.stderr.splitlines() if "GPU" in line])
    cpu, gpu = runs
    assert "--gpus" not in cpu and "--device" not in cpu, cpu
    assert "PET_NPROC_PER_NODE=2" in cpu
    assert notes[0] == [
        "ddpkit: no GPU visible here (nvidia-smi -L); the container runs 2 process(es) on "
        'the CPU (gloo), as accelerator = "cpu" says'
    ], notes[0]
    assert ("--gpus" in gpu or "--device" in gpu) and notes[1] == [], (gpu, notes[1])


def test_a_sweep_runs_n_named_containers_one_after_the_other(fake_bin, launcher, tmp_path):
    fake_bin.add("docker", RECORDING_ENGINE + "sys.exit(3 if 'sw-1' in sys.argv else 0)\n")
    args = ["--sweep", "train.steps=5,7", "--set", "name=sw", "--set", "accelerator=cpu"]
    r = launcher("submit", "docker", *args, cwd=tmp_path)  # its job records: tmp, not the checkout
    assert r.returncode == 3, r.stderr  # a member's failure is the sweep's status
    runs = [json.loads(x) for x in (fake_bin.path / "docker.log").read_text().splitlines()]
    runs = [a for a in runs if a[0] == "run"]
    assert [a[a.index("--name") + 1] for a in runs] == ["sw-0", "sw-1"]
    assert [a[a.index("--steps") + 1] for a in runs] == ["5", "7"]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--nodes", "2"], "docker runs one node"),
        (["--set", "train.run_dir=/scratch/x"], "outside the mounted runs/ volume"),
        (["--set", "ckpt_dir=../elsewhere"], "outside the mounted runs/ volume"),
        (["--set", "docker.gpus=all", "--gpus", "4"], "drop one of them"),
        (["--set", "docker.gpus=0,1", "--gpus", "4"], "2 device(s)"),
        (["--set", "docker.gpus=first"], 'use "all" or device ids'),
        (["--set", "image=-v/:/host"], "is not an image reference"),
        (["--set", "docker.data_dir=/data/a:b"], "docker.data_dir '/data/a:b' holds a ':'"),
        (["--set", "docker.data_dir=/d", "--set", "train.data_dir=x:y"], "holds a ':'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expect, launcher, one_line_error):
    r = launcher("render", "docker", "--config", "configs/default.toml", *args)
    assert expect in one_line_error(r), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_a_value_no_program_can_receive_is_refused_at_render(backend, launcher, one_line_error,
                                                              tmp_path):  # fmt: skip
    """A NUL (a TOML escape can write one) cannot reach a program in argv or the environment:
    every backend refuses it in one line instead of cutting the value short."""
    job = tmp_path / "ddpkit.toml"
    for table in ('[env]\nX = "a\\u0000b"\n', 'args = ["--data-dir", "d\\u0000x"]\n'):
        job.write_text(f'name = "nul"\nimage = "nul:1"\nscript = "train.py"\n{table}')
        (tmp_path / "train.py").write_text("print('hi')\n")
        r = launcher("render", backend, "--config", str(job), cwd=tmp_path)
        assert "NUL character" in one_line_error(r), r.stderr
        assert r.stdout == ""


def test_entrypoint_train_flags_go_to_the_node_launcher(tmp_path):
    rc, _, err = _finish(
        _entrypoint(tmp_path, "--name", "t", "--steps", "3", env={"PET_NPROC_PER_NODE": ""})
    )
    assert rc == 0, err
    args = _node_args(tmp_path)
    # no GPU here: one process per CPU this process may use; no rendezvous: standalone
    assert args[: args.index("--")] == [
        "--nproc-per-node", str(len(os.sched_getaffinity(0))), "--standalone"]  # fmt: skip
    assert args[args.index("--") :] == ["--", "-m", "ddpkit.train", "--name", "t", "--steps", "3"]


def test_entrypoint_bad_input_and_commands(tmp_path):
    # The real node launcher: the trainer's own check, one line, exit 2, no torchrun.
    rc, out, err = _finish(_entrypoint(tmp_path, "--batch-size", "0", fake=False))
    lines = [x for x in err.splitlines() if not x.startswith("ddpkit: python -m ddpkit.train.node")]
    assert rc == 2 and len(lines) == 1 and "batch" in lines[0], err
    assert not (tmp_path / "runs").exists()
    rc, out, _ = _finish(_entrypoint(tmp_path, "echo", "a b"))
    assert (rc, out) == (0, "a b\n")


@pytest.mark.slow
def test_entrypoint_forwards_usr1_and_exits_75_after_a_checkpoint(tmp_path):
    """Real torchrun, 2 gloo ranks: SIGUSR1 to the entrypoint -> save -> requeue -> 75."""
    p = _entrypoint(
        tmp_path,
        *("--name", "sig", "--steps", "100000", "--log-interval", "2", "--no-eval"),
        env={"PET_NPROC_PER_NODE": "2"},
        fake=False,
    )
    metrics = tmp_path / "runs" / "sig" / "metrics.jsonl"
    deadline = time.time() + 120
    while not metrics.exists() or not metrics.read_text().strip():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.5)
    p.send_signal(10)  # SIGUSR1, as `#SBATCH --signal=USR1@...` sends it
    rc, _, err = _finish(p)
    assert rc == 75, err[-3000:]
    requeue = json.loads((tmp_path / "runs" / "sig" / "requeue.json").read_text())
    assert requeue["signal"] == "SIGUSR1"
    assert (tmp_path / requeue["checkpoint"] / ".complete").exists()


def test_logs_follow_and_list_ask_the_engine(fake_bin, launcher):
    fake_bin.add("docker", RECORDING_ENGINE)
    r = launcher("logs", "docker", "job1", "--follow")
    assert r.returncode == 0, r.stderr
    calls = [json.loads(line) for line in (fake_bin.path / "docker.log").read_text().splitlines()]
    assert calls[-1] == ["logs", "--follow", "job1"]
    argv = docker.run_argv(_spec("name=job1"))
    assert argv[argv.index("--label") + 1] == "app.kubernetes.io/instance=job1"
