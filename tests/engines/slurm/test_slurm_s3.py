"""The kit's trainer on the real 2-node SLURM cluster with `ckpt_dir = "s3://..."` on the real
S3 server (tests/s3_fixtures.py; loopback, which the local cluster's nodes share): the store's
credentials reach the job by name (slurm.secret_env), never a rendered script or a log; a
preempted job (`scancel --signal=USR1`) saves to the store, exits 75, is requeued once by its
batch script, resumes from the store and ends with the digest of an uninterrupted run. This
is the SLURM preemption drill: test_slurm_e2e.py's own preempted job (the same job with its
checkpoints on the shared disk, the same assertions) ran the same drill a second time. In
the engines/slurm chunk, which has the cluster; the S3 fixture waits for a running server
build."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.engines.slurm.test_slurm_e2e import (  # noqa: F401  (reference: fixture)
    REPO,
    STEPS,
    diverged,
    job_file,
    reference,
)
from tests.s3_fixtures import S3Server, s3_server  # noqa: F401  (fixture)
from tests.slurm_fixtures import scontrol, slurm_cluster, until_done  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.s3, pytest.mark.slow]
SECRETS = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]


def _store_job(tmp_path: Path, name: str, url: str, endpoint: str) -> Path:
    cfg = job_file(tmp_path, name)
    text = cfg.read_text().replace("[train]\n", f'ckpt_dir = "{url}"\n[train]\n')
    cfg.write_text(
        text + f'[env]\nAWS_ENDPOINT_URL = "{endpoint}"\nAWS_DEFAULT_REGION = "us-east-1"\n'
        f"[slurm]\nsecret_env = {json.dumps(SECRETS)}\n"
    )
    return cfg


def _ddpkit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "ddpkit", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_a_preempted_job_resumes_from_the_store_with_the_same_digest(
    reference: dict,  # noqa: F811
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = s3_server.env()
    url = s3_server.bucket("slurm") + "/e2e"
    cfg = _store_job(tmp_path, "s3-preempt", url, s3_server.endpoint)
    rendered = _ddpkit(env, "render", "slurm", "--config", str(cfg), "--nodes", "2", "--gpus", "1")
    assert rendered.returncode == 0, rendered.stderr
    assert s3_server.secret not in rendered.stdout and s3_server.access not in rendered.stdout
    assert "printenv AWS_SECRET_ACCESS_KEY" in rendered.stdout  # checked by name on the node
    sub = _ddpkit(env, "submit", "slurm", "--config", str(cfg), "--nodes", "2", "--gpus", "1")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("submitted job ", 1)[1].split()[0]
    run = tmp_path / "s3-preempt"
    try:
        metrics, deadline = run / "metrics.jsonl", time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
            assert time.monotonic() < deadline, "the job never reached step 40"
            assert scontrol(job)["JobState"] in ("PENDING", "RUNNING"), scontrol(job)
            time.sleep(0.5)
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        info = until_done(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    # Global rank 0 (which prints) may sit on either node: read every log of the job.
    logs = "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, logs[-3000:])
    assert "requeue 1 of 3" in logs, logs[-3000:]
    assert not (run / "requeue.json").exists()
    resumed = [ln for ln in logs.splitlines() if "resumed from" in ln]
    assert resumed and f"resumed from {url}/step-" in resumed[0], logs[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"].startswith(f"{url}/step-")
    assert summary["steps"] == STEPS and summary["world_size"] == reference["world_size"] == 2
    assert summary["param_digest"] == reference["param_digest"], diverged(run)
    fs = s3_server.fs()
    assert fs.exists(f"slurm/e2e/step-{summary['steps']}/.complete")
    assert not (run / "checkpoints").exists()  # nothing of the store's on the shared disk
    for f in [*run.rglob("*"), *(tmp_path / "s3-preempt.toml",)]:  # scripts, pickles, logs
        if f.is_file():
            data = f.read_bytes()
            assert (
                s3_server.secret.encode() not in data and s3_server.access.encode() not in data
            ), f
