"""The image and the docker backend.

Tiers: lint and render checks (fast); the entrypoint against a fake torchrun (fast) and a
real 2-process torchrun on the host (slow); a real podman build and run of the image from a
locally made CPU base (container + slow, skipped where no engine can run it).

Here the tests that run in this process; those that start processes in
tests/process/backends/test_docker.py, those on a real container engine (podman builds and runs
the image) in tests/engines/container/test_docker.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.docker import backend as docker
from ddpkit.tools.jobspec import load_spec
from ddpkit.tools.templating import KIT_DIR as REPO_ROOT

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
