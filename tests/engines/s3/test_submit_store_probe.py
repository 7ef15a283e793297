"""Bad object-store settings are refused at submit, not found on the nodes: `ddpkit submit
slurm` from a user's project in a temp dir, with ckpt_dir = "s3://..." on a real S3-compatible
server (tests/s3_fixtures.py: versitygw on loopback) and a fake sbatch on PATH that records
any call. A wrong secret or a missing bucket: one line, exit 2, sbatch never called, no
credential in the output; the right settings: queued. `ddpkit run` is refused the same way
before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeBin
from tests.s3_fixtures import S3Server, s3_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.s3

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
TRAIN_PY = "print('trained', flush=True)\n"


@pytest.fixture
def s3(s3_server: S3Server) -> S3Server:  # noqa: F811  (the session's server)
    return s3_server


def project(tmp_path: Path, url: str) -> tuple[Path, Path, FakeBin]:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN_PY)
    (proj / "ddpkit.toml").write_text(
        f'name = "s3job"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'
        f'ckpt_dir = "{url}"\n'
    )
    calls = tmp_path / "slurm-calls"
    fakes = FakeBin(tmp_path / "bin")
    for name in ("sbatch", "sinfo", "squeue", "scontrol", "sacct"):
        fakes.add(name, f'#!/bin/sh\necho "{name} $*" >> {calls}\necho 4242\n')
    return proj, calls, fakes


def ddpkit(proj: Path, env: dict[str, str], fakes: FakeBin, *args: str):
    env = {k: v for k, v in env.items() if not k.startswith("DDPKIT_")}
    env["PATH"] = f"{fakes.path}:{env['PATH']}"
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=300
    )


def _no_secret(s3: S3Server, proc: subprocess.CompletedProcess[str], *secrets: str) -> None:
    out = proc.stdout + proc.stderr
    for value in (s3.access, s3.secret, *secrets):
        assert value not in out, "a credential was printed"


@pytest.mark.parametrize("case", ["wrong-secret", "wrong-access-key", "missing-bucket"])
@pytest.mark.parametrize(
    "action", [["submit", "slurm", "--nodes", "2"], ["run"]], ids=["submit-slurm", "run"]
)
def test_bad_store_settings_are_refused_before_the_queue(
    tmp_path, s3: S3Server, one_line_error, case, action
):
    bucket = s3.bucket("probe-good")
    url = "s3://no-such-bucket-here/ckpt" if case == "missing-bucket" else f"{bucket}/ckpt"
    proj, calls, fakes = project(tmp_path, url)
    wrong = "x" * 40
    env = {
        "wrong-secret": s3.env(secret=wrong),
        "wrong-access-key": s3.env(access=f"AKIA{wrong[:16]}"),
        "missing-bucket": s3.env(),
    }[case]
    r = ddpkit(proj, env, fakes, *action)
    line = one_line_error(r)
    assert url in line and "checked before the queue" in line, line
    if case != "missing-bucket":
        assert "refused the credentials" in line, line
    else:
        assert "no bucket 'no-such-bucket-here'" in line, line
    assert not calls.exists(), f"SLURM was called: {calls.read_text()}"
    assert not (proj / "runs").exists(), "the job started"
    _no_secret(s3, r, wrong)


def test_the_right_store_settings_are_queued(tmp_path, s3: S3Server):
    proj, calls, fakes = project(tmp_path, f"{s3.bucket('probe-good')}/ckpt")
    r = ddpkit(proj, s3.env(), fakes, "submit", "slurm", "--nodes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "submitted job 4242" in r.stdout and "sbatch" in calls.read_text()
    _no_secret(s3, r)


def test_the_job_files_env_table_is_the_credentials_asked(tmp_path, s3: S3Server):
    """The endpoint in the job's env table (what the nodes get) is the one probed: a shell
    without AWS_ENDPOINT_URL does not make the store unreachable."""
    proj, calls, fakes = project(tmp_path, f"{s3.bucket('probe-good')}/ckpt")
    with (proj / "ddpkit.toml").open("a") as f:
        f.write(f'[env]\nAWS_ENDPOINT_URL = "{s3.endpoint}"\n')
    env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    r = ddpkit(proj, env, fakes, "submit", "slurm", "--nodes", "2")
    assert r.returncode == 0 and "does not answer" not in r.stdout, r.stdout + r.stderr
    assert "sbatch" in calls.read_text()


def test_a_store_that_does_not_answer_from_here_is_left_to_the_nodes(tmp_path, s3: S3Server):
    """An endpoint this host cannot reach (only the nodes' network may): a note, then queued."""
    proj, calls, fakes = project(tmp_path, f"{s3.bucket('probe-good')}/ckpt")
    env = {**s3.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    r = ddpkit(proj, env, fakes, "submit", "slurm", "--nodes", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "does not answer from this host" in r.stdout and "sbatch" in calls.read_text()
