"""Checkpoints in an object store (`--ckpt-dir s3://bucket/prefix`) on a real S3-compatible
server (tests/s3_fixtures.py: versitygw on loopback): resume after a SIGKILL bitwise, async
saves resharded 2 -> 4 ranks at the exact data position, a damaged object caught by its
checksum, an upload cut off half way never loaded, and wrong credentials or a missing bucket
refused in one line before training."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.s3_fixtures import S3Server, s3_server  # noqa: F401  (the fixture)
from tests.trainrun import PY, clean_env, train

pytestmark = [pytest.mark.slow, pytest.mark.s3]  # s3: its own lane chunk, after its build

ARGS = ("--no-eval", "--log-interval", "3", "--batch-size", "8", "--synthetic-samples", "512")
ARGS += ("--lr", "3e-3", "--ckpt-interval", "3")


def _env(s3: S3Server, tmp: Path, **extra: str) -> dict[str, str]:
    keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    env = s3.env(extra.pop("access", None), extra.pop("secret", None))
    return {**{k: env[k] for k in keys}, "DDPKIT_CKPT_STAGE": str(tmp / "stage"), **extra}


def _steps(s3: S3Server, url: str) -> dict[str, set[str]]:
    """{step name: its object names} under a checkpoint URL (not the run's summary.json)."""
    fs = s3.fs()
    root = url.removeprefix("s3://")
    out: dict[str, set[str]] = {}
    for key in fs.find(root):
        if "/" not in key[len(root) + 1 :]:
            continue
        step, name = key[len(root) + 1 :].split("/", 1)
        out.setdefault(step, set()).add(name)
    return out


def _trace(d: Path) -> list[int]:
    """Every epoch-0 sample index the ranks trained on (DDPKIT_TRACE_SAMPLES files). A DDP
    resume on more than 2 ranks draws its first batch once more for two discarded passes
    (Trainer._settle_ddp_buckets) before training on it: a batch traced twice in a row."""
    seen = []
    for f in sorted(d.glob("rank*.txt")):
        lines = f.read_text().splitlines()
        for i, line in enumerate(lines):
            ep, *idx = map(int, line.split())
            seen += idx if ep == 0 and (i == 0 or line != lines[i - 1]) else []
    return seen


@pytest.fixture(scope="module")
def base(s3_server: S3Server, tmp_path_factory) -> str:  # noqa: F811
    """A finished one-process run with complete checkpoints at steps 3 and 6 in the store."""
    url = s3_server.bucket("base") + "/run"
    tmp = tmp_path_factory.mktemp("base")
    train(tmp / "run", *ARGS, "--steps", "6", "--ckpt-dir", url, env=_env(s3_server, tmp))
    return url


def test_sigkill_resume_from_the_store_is_bitwise_identical(s3_server, tmp_path):  # noqa: F811
    url = s3_server.bucket("kill") + "/run"
    common = (*ARGS, "--steps", "12", "--ckpt-keep", "2")
    ref = train(tmp_path / "ref", *common, nproc=2)
    run = train(
        tmp_path / "run",
        *common,
        "--ckpt-dir",
        url,
        nproc=2,
        torchrun_args=("--max-restarts", "1"),
        env=_env(s3_server, tmp_path, DDPKIT_FAULT="kill@8:1"),
    )  # rank 1 SIGKILLs itself before step 8; torchrun restarts the group from the store
    assert "[fault injection] kill on rank 1 at step 8" in run.out
    assert run.summary["resumed_from"] == f"{url}/step-6"
    assert run.summary["param_digest"] == ref.summary["param_digest"]
    steps = _steps(s3_server, url)
    assert sorted(steps) == ["step-12", "step-9"]  # keep-K in the store
    assert {".complete", ".metadata", "__0_0.distcp", "__1_0.distcp"} <= steps["step-12"]
    # the staging dir keeps no step once its upload is done
    assert not list((tmp_path / "stage").glob("*/step-*"))


def test_async_saves_to_the_store_reshard_2_to_4_at_the_exact_data_position(
    s3_server,  # noqa: F811
    tmp_path,
):
    url = s3_server.bucket("reshard") + "/run"
    ta, tb = tmp_path / "ta", tmp_path / "tb"
    ta.mkdir()
    tb.mkdir()
    env = _env(s3_server, tmp_path)
    a = train(tmp_path / "a", *ARGS, "--steps", "6", "--ckpt-dir", url, "--ckpt-async",
              nproc=2, env={**env, "DDPKIT_TRACE_SAMPLES": str(ta)})  # fmt: skip
    assert a.summary["steps"] == 6
    # The rest of epoch 0 on 4 ranks: 512 - 6*16 = 416 samples = 13 steps of 32.
    b = train(tmp_path / "b", *ARGS, "--steps", "19", "--ckpt-dir", url, "--ckpt-async",
              nproc=4, env={**env, "DDPKIT_TRACE_SAMPLES": str(tb)})  # fmt: skip
    assert f"resumed from {url}/step-6 at step 6" in b.out
    assert "world size 2 -> 4: global batch 16 -> 32" in b.out
    seen = _trace(ta) + _trace(tb)
    assert len(seen) == len(set(seen)) == 512  # every sample of the epoch exactly once
    assert ".complete" in _steps(s3_server, url)["step-19"]


def test_a_flipped_byte_in_an_object_is_caught_and_the_previous_checkpoint_used(
    s3_server,  # noqa: F811
    base,
    tmp_path,
):
    fs = s3_server.fs()
    url = s3_server.bucket("flip") + "/run"
    fs.copy(base.removeprefix("s3://"), url.removeprefix("s3://"), recursive=True)
    key = f"{url.removeprefix('s3://')}/step-6/__0_0.distcp"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(key, bytes(data))
    run = train(tmp_path / "run", *ARGS, "--steps", "8", "--ckpt-dir", url,
                env=_env(s3_server, tmp_path))  # fmt: skip
    assert f"warning: skipping checkpoint {url}/step-6: __0_0.distcp fails its checksum" in run.out
    assert run.summary["resumed_from"] == f"{url}/step-3"


def test_a_rewind_in_the_store_sets_the_later_timeline_aside(s3_server, base, tmp_path):  # noqa: F811
    """--resume URL/step-3 of a store that holds step-6 (as a local rewind): the later step
    moves under abandoned/ with one line, keep-K keeps the new timeline's saves and --resume
    auto goes on from them. The store also keeps each run's summary.json."""
    fs = s3_server.fs()
    url = s3_server.bucket("rewind") + "/run"
    fs.copy(base.removeprefix("s3://"), url.removeprefix("s3://"), recursive=True)
    env = _env(s3_server, tmp_path)
    rewind = train(tmp_path / "run", *ARGS, "--steps", "6", "--ckpt-dir", url, "--ckpt-keep", "1",
                   "--resume", f"{url}/step-3", env=env)  # fmt: skip
    assert f"rewound to step-3: the later step-6 (another timeline) moved to {url}/abandoned" in (
        rewind.out
    )
    left = _steps(s3_server, url)
    assert sorted(n for n in left if n.startswith("step-")) == ["step-6"]
    assert {n.split("/")[0].split(".")[0] for n in left["abandoned"]} == {"step-6"}
    assert {n.split("/", 1)[1] for n in left["abandoned"]} >= {".complete", "__0_0.distcp"}
    again = train(tmp_path / "run", *ARGS, "--steps", "9", "--ckpt-dir", url, env=env)
    assert again.summary["resumed_from"] == f"{url}/step-6"
    stored = json.loads(fs.cat_file(f"{url.removeprefix('s3://')}/summary.json"))
    assert stored["param_digest"] == again.summary["param_digest"] and stored["steps"] == 9


def test_an_upload_killed_half_way_is_never_loaded(s3_server, tmp_path):  # noqa: F811
    url = s3_server.bucket("halfway") + "/run"
    env = _env(s3_server, tmp_path)
    killed = train(tmp_path / "run", *ARGS, "--steps", "9", "--ckpt-dir", url, check=False,
                   env={**env, "DDPKIT_FAULT": "killupload@6:0"})  # fmt: skip
    assert killed.rc == -9, killed.out[-2000:]
    left = _steps(s3_server, url)
    assert "__0_0.distcp" in left["step-6"] and ".complete" not in left["step-6"]
    run = train(tmp_path / "run", *ARGS, "--steps", "9", "--ckpt-dir", url, env=env)
    assert f"warning: skipping incomplete checkpoint {url}/step-6 (no .complete marker" in run.out
    assert run.summary["resumed_from"] == f"{url}/step-3"
    assert ".complete" in _steps(s3_server, url)["step-9"]


def test_ckpt_inspect_and_export_read_a_checkpoint_in_the_store(s3_server, base, tmp_path):  # noqa: F811
    env = clean_env(**_env(s3_server, tmp_path))
    ddpkit = [PY, "-m", "ddpkit", "ckpt"]
    got = subprocess.run([*ddpkit, "inspect", base, "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["step"] == 6
    out = tmp_path / "model.pt"
    got = subprocess.run([*ddpkit, "export", f"{base}/step-3", str(out)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    import torch

    assert torch.load(out, weights_only=True)["meta"]["step"] == 3


@pytest.mark.parametrize("case", ["wrong secret", "missing bucket"])
def test_wrong_credentials_or_a_missing_bucket_is_one_line_before_training(
    s3_server,  # noqa: F811
    tmp_path,
    case,
):
    wrong = "0" * 40
    if case == "wrong secret":
        url, env = s3_server.bucket("creds") + "/run", _env(s3_server, tmp_path, secret=wrong)
        want = "the object store refused the credentials"
    else:
        url, env = "s3://no-such-bucket/run", _env(s3_server, tmp_path)
        want = "no bucket 'no-such-bucket' at the object store"
    rd = tmp_path / "run"
    run = train(rd, *ARGS, "--steps", "3", "--ckpt-dir", url, env=env, check=False)
    assert run.rc == 2, run.out[-2000:]
    [line] = run.out.strip().splitlines()
    assert line.startswith(f"error: --ckpt-dir {url}: {want}"), line
    assert s3_server.secret not in run.out and wrong not in run.out
    assert not rd.exists()  # nothing written: refused before the run dir


def test_a_store_url_keeps_its_scheme_in_the_requeue_marker_and_the_divergence_line(
    s3_server,  # noqa: F811
    tmp_path,
):
    """Where a URL went through pathlib it read `s3:/bucket/...`: the requeue marker named no
    checkpoint, the divergence line said none was saved, and --resume URL was a local path."""
    url = s3_server.bucket("scheme") + "/run"
    env = _env(s3_server, tmp_path)
    rd = tmp_path / "run"
    # Every step agrees on stop signals (--stop-check-s 0): the SIGTERM at step 5 is acted on
    # there, not at the end of a fast run, and the NaN at step 8 comes after the resume.
    common = (*ARGS, "--steps", "12", "--ckpt-dir", url, "--stop-check-s", "0")
    stopped = train(rd, *common, check=False, env={**env, "DDPKIT_FAULT": "signal@5:0:SIGTERM"})
    assert stopped.rc == 75, stopped.out[-2000:]
    marker = json.loads((rd / "requeue.json").read_text())
    assert marker["checkpoint"] == f"{url}/step-{marker['step']}"
    assert ".complete" in _steps(s3_server, url)[f"step-{marker['step']}"]
    diverged = train(rd, *common, check=False, env={**env, "DDPKIT_FAULT": "nan@8:0"})
    assert diverged.rc == 3, diverged.out[-2000:]
    done = [s for s, names in _steps(s3_server, url).items() if ".complete" in names]
    last = f"{url}/{max(done, key=lambda s: int(s[5:]))}"  # the newest before step 8
    [line] = [ln for ln in diverged.out.splitlines() if ln.startswith("error:")]
    assert f"the last finite checkpoint is {last}:" in line
    assert line.endswith(f"--resume {last}"), line
    resumed = train(tmp_path / "again", *ARGS, "--steps", "9", "--resume", last, env=env)
    assert resumed.summary["resumed_from"] == last
    assert resumed.summary["steps"] == 9
    missing = train(tmp_path / "gone", *ARGS, "--steps", "9", "--resume", f"{url}/step-99",
                    env=env, check=False)  # fmt: skip
    assert missing.rc == 2
    [line] = missing.out.strip().splitlines()
    assert line.startswith(f"error: --resume {url}/step-99: not a complete ddpkit checkpoint")
