"""The image and the docker backend.

Tiers: lint and render checks (fast); the entrypoint against a fake torchrun (fast) and a
real 2-process torchrun on the host (slow); a real podman build and run of the image from a
locally made CPU base (container + slow, skipped where no engine can run it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
from ddpkit.docker import backend as docker
from ddpkit.tools.jobspec import load_spec
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT

from tests import container_harness as harness
from tests.conftest import FakeBin

VENV_BIN = Path(sys.executable).parent
ENTRYPOINT = REPO_ROOT / "docker" / "entrypoint.sh"
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"


def _spec(*sets: str, gpus: int | None = None, train_args: list[str] | None = None):
    return load_spec(REPO_ROOT / "configs/default.toml", list(sets), None, gpus, train_args)


# A fake engine that appends its argv, as one JSON line, to <itself>.log.
RECORDING_ENGINE = (
    "#!/usr/bin/env python3\nimport json, sys\n"
    "print(json.dumps(sys.argv[1:]), file=open(sys.argv[0] + '.log', 'a'))\n"
)


# --- lint -------------------------------------------------------------------------------


def test_hadolint_passes_with_no_ignored_rule():
    assert "hadolint ignore" not in DOCKERFILE.read_text()
    r = subprocess.run(
        [str(VENV_BIN / "hadolint"), str(DOCKERFILE)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_shellcheck_passes_on_the_entrypoint():
    r = subprocess.run(
        [str(VENV_BIN / "shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


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


# --- render ---------------------------------------------------------------------------------


def test_render_has_the_gpu_flags_and_the_volumes():
    argv = docker.run_argv(_spec(gpus=8))
    text = " ".join(argv)
    assert argv[:3] == ["docker", "run", "--rm"]
    assert "--gpus 8" in text  # as many GPUs as processes, not all of the machine's
    assert "--shm-size=16g" in argv
    assert "--ulimit memlock=-1" in text and "--ulimit stack=67108864" in text
    assert f"{REPO_ROOT}/runs:/workspace/runs" in argv
    assert "PET_NPROC_PER_NODE=8" in argv
    # torchrun's shutdown timeout (30 s default) must fit in docker stop's grace
    assert "--stop-timeout=60" in argv
    image_at = argv.index("ddpkit:latest")
    rest = argv[image_at + 1 :]  # the node launcher's flags, then the entry point
    assert rest[: rest.index("--")] == [
        "--run-dir", "runs/default", "--shutdown-timeout", "30", "--max-restarts=3"]  # fmt: skip
    assert rest[rest.index("--") + 1 :] == ["-m", "ddpkit.train", *_spec(gpus=8).train_argv()]


@pytest.mark.parametrize(
    ("sets", "gpus", "flag", "nproc"),
    [
        ([], 2, "2", "2"),
        ([], None, "1", "1"),
        (["docker.gpus=all"], None, "all", None),  # the entrypoint counts the visible GPUs
        (["docker.gpus=1,3"], None, '"device=1,3"', "2"),
        (["docker.gpus=1,3"], 2, '"device=1,3"', "2"),
    ],
)
def test_gpus_follow_the_process_count(sets, gpus, flag, nproc):
    argv = docker.run_argv(_spec(*sets, gpus=gpus))
    assert argv[argv.index("--gpus") + 1] == flag
    found = [a for a in argv if a.startswith("PET_NPROC_PER_NODE=")]
    assert found == ([f"PET_NPROC_PER_NODE={nproc}"] if nproc else [])


@pytest.mark.parametrize(
    ("sets", "gpus", "devices"),
    [
        ([], 2, ["0", "1"]),
        (["docker.gpus=all"], None, ["all"]),
        (["docker.gpus=1,3"], None, ["1", "3"]),
    ],
)
def test_podman_gets_the_nvidia_cdi_devices(sets, gpus, devices):
    argv = docker.run_argv(_spec(*sets, gpus=gpus), engine="podman")
    assert "--gpus" not in argv  # podman 4 has no such flag; its CDI devices instead
    got = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert got == [f"nvidia.com/gpu={d}" for d in devices]


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


def test_logs_follow_and_list_ask_the_engine(fake_bin, launcher):
    fake_bin.add("docker", RECORDING_ENGINE)
    r = launcher("logs", "docker", "job1", "--follow")
    assert r.returncode == 0, r.stderr
    calls = [json.loads(line) for line in (fake_bin.path / "docker.log").read_text().splitlines()]
    assert calls[-1] == ["logs", "--follow", "job1"]
    argv = docker.run_argv(_spec("name=job1"))
    assert argv[argv.index("--label") + 1] == "app.kubernetes.io/instance=job1"


def test_poll_running_then_the_recorded_exit_status(tmp_path, monkeypatch, fake_bin):
    from ddpkit.tools.backends import JobState, record_job

    fake_bin.add(
        "docker", '#!/usr/bin/env bash\n[[ $1 == ps ]] && printf "%s" "${FAKE_PS:-}"\nexit 0\n'
    )
    monkeypatch.chdir(tmp_path)  # the workspace: .ddpkit/jobs/
    record_job("docker", "j1", engine="docker", image="x", run_dir="runs/j1")
    monkeypatch.setenv("FAKE_PS", "running\tUp 3 seconds")
    assert docker.poll("j1").state is JobState.RUNNING
    monkeypatch.setenv("FAKE_PS", "")
    assert docker.poll("j1").state is JobState.UNKNOWN  # gone, no exit status recorded
    record_job("docker", "j1", engine="docker", image="x", run_dir="runs/j1", exit_code=75)
    st = docker.poll("j1")
    assert (st.state, st.exit_code) == (JobState.FAILED, 75)


def test_a_sweep_runs_n_named_containers_one_after_the_other(fake_bin, launcher, tmp_path):
    fake_bin.add("docker", RECORDING_ENGINE + "sys.exit(3 if 'sw-1' in sys.argv else 0)\n")
    args = ["--sweep", "train.steps=5,7", "--set", "name=sw", "--set", "accelerator=cpu"]
    r = launcher("submit", "docker", *args, cwd=tmp_path)  # its job records: tmp, not the checkout
    assert r.returncode == 3, r.stderr  # a member's failure is the sweep's status
    runs = [json.loads(x) for x in (fake_bin.path / "docker.log").read_text().splitlines()]
    runs = [a for a in runs if a[0] == "run"]
    assert [a[a.index("--name") + 1] for a in runs] == ["sw-0", "sw-1"]
    assert [a[a.index("--steps") + 1] for a in runs] == ["5", "7"]


def test_render_cpu_run_has_no_gpu_flag_and_mounts_data_read_only(tmp_path):
    spec = _spec("accelerator=cpu", f"docker.data_dir={tmp_path}", "train.data_dir=data/mnist")
    argv = docker.run_argv(spec)
    assert "--gpus" not in argv
    assert f"{tmp_path}:/workspace/data/mnist:ro" in argv


def test_rendered_text_is_the_argv_and_quotes_hostile_values(tmp_path, fake_bin):
    marker = tmp_path / "pwned"
    spec = _spec(f"env.X=$(touch {marker}); echo 'it''s' `id`", "accelerator=cpu")
    text = docker.render(spec)
    fake_bin.add(
        "docker", "#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
    )
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ["docker", *json.loads(r.stdout)] == docker.run_argv(spec)
    assert not marker.exists()


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


def test_build_argv_bakes_the_builders_ids_but_never_root():
    argv = docker.build_argv("podman", "img:t", "base:1", "abc", "", 1234, 99, version="0.3")
    assert argv[:2] == ["podman", "build"] and argv[-1] == "."
    for pair in ("BASE_IMAGE=base:1", "REVISION=abc", "UID=1234", "GID=99", "VERSION=0.3"):
        assert pair in argv
    root = docker.build_argv("docker", "img:t", None, "abc", "", uid=0, gid=0)
    assert not any(a.startswith(("UID=", "GID=", "BASE_IMAGE=")) for a in root)


# --- the entrypoint, on the host --------------------------------------------------------


def _entrypoint(tmp_path: Path, *args: str, env: dict[str, str] | None = None, fake=True):
    """Run docker/entrypoint.sh in tmp_path; with fake=True `python` only records the node
    launcher's command line (and exits FAKE_STATUS), anything else runs the real python."""
    bins = [str(VENV_BIN)]
    if fake:
        fakes = FakeBin(tmp_path / "fakebin")
        fakes.add(
            "python",
            "#!/usr/bin/env bash\n"
            "if [[ $1 == -m && $2 == ddpkit.train.node ]]; then\n"
            "    printf '%s\\n' \"$@\" > node.args; exit ${FAKE_STATUS:-0}\n"
            "fi\n"
            f'exec {sys.executable} "$@"\n',
        )
        bins.insert(0, str(fakes.path))
    base = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    full = {
        **base,
        "PET_NPROC_PER_NODE": "1",  # skips counting devices (a torch import) unless unset
        "PATH": ":".join([*bins, os.environ["PATH"]]),
        "DDPKIT_HOME": str(REPO_ROOT),
        "PYTHONPATH": str(REPO_ROOT),
        **(env or {}),
    }
    return subprocess.Popen(
        [str(ENTRYPOINT), *args],
        cwd=tmp_path,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def _node_args(tmp_path: Path) -> list[str]:
    args = (tmp_path / "node.args").read_text().splitlines()
    assert args[:2] == ["-m", "ddpkit.train.node"]
    return args[2:]


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


def test_entrypoint_runs_what_the_launcher_renders(tmp_path):
    spec = load_spec(REPO_ROOT / "examples/plain_torchrun/job.toml", ["args=['--steps','5']"])
    rc, _, err = _finish(_entrypoint(tmp_path, *docker.node_args(spec)))
    assert rc == 0, err
    args = _node_args(tmp_path)
    assert args == ["--standalone", *docker.node_args(spec)]
    assert args[args.index("--") :] == ["--", "ddp_fit.py", "--steps", "5"]


def test_entrypoint_leaves_launcher_pet_variables_to_torchrun(tmp_path):
    env = {"PET_NPROC_PER_NODE": "4", "PET_NNODES": "2", "PET_MASTER_ADDR": "job-master-0"}
    rc, _, err = _finish(_entrypoint(tmp_path, "--steps", "3", env=env))
    assert rc == 0, err
    args = _node_args(tmp_path)
    for flag in ("--standalone", "--nproc-per-node"):
        assert flag not in args


def test_entrypoint_passes_the_node_launchers_exit_status_through(tmp_path):
    for status in ("75", "3", "2"):
        rc, _, err = _finish(_entrypoint(tmp_path, "--name", "t", env={"FAKE_STATUS": status}))
        assert rc == int(status), err


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


# --- the real image, built and run with podman ---------------------------------------------

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
        # 0.3 s a step, asleep (train/fault.py): 200 steps (a minute after the kill, as the
        # local torchft tests give) outlast group 1's restart without burning the cores as the
        # 30M-parameter mlp-deep did: 31 machine CPU-s a run of 300, not 187
        "env.DDPKIT_STEP_PACE_S=0.3",
    ]  # fmt: skip
    steps = 200
    train = ["--model", "mlp", "--batch-size", "16", "--steps", str(steps),
             "--log-interval", "5", "--no-eval", "--ckpt-interval", "100"]  # fmt: skip
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
