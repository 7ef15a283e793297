"""JobSpec: TOML + overrides, precedence, and every validation error (exit 2, one line).

Here the tests that start processes; the in-process ones in tests/unit/launch/test_spec.py.
Helpers both use are in tests/unit/launch/test_spec.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.jobspec import SpecError, load_spec

from tests.unit.launch.test_spec import _IN_CONTAINER, REPO, write

BAD = [
    (["nodes=0"], "nodes must be >= 1"),
    (["nproc_per_node=0"], "processes per node must be >= 1"),
    (["name=Bad;rm -rf /"], "is not safe"),
    (["name=$(reboot)"], "is not safe"),
    (["time=1h"], "does not parse"),
    (["time=0"], "does not parse"),
    (["mem=lots"], "mem 'lots' does not parse"),
    (
        ["slurm.partitoin=gpu"],
        "unknown key 'partitoin'; did you mean partition? valid keys in [slurm]: partition",
    ),
    (["bogus=1"], "unknown key 'bogus'; valid keys in the top level: name"),
    (["train.lrr=1"], "valid keys in [train]:"),
    (["train.lr=abc"], "cannot parse 'abc' as float"),
    (["nodes=two"], "cannot parse 'two' as int"),
    (["slurm.container=docker"], "is not one of none, pyxis, apptainer"),
    (["debug=loud"], "is not one of off, warn, info, trace"),
    (["env.1X=a"], "is not a variable name"),
    (["rdzv_port=70000"], "is not a port"),
    # single-value rules declared on the fields (ddpkit.train.dataclass_fields), nested tables too
    (["ckpt_dir=-x"], "ckpt_dir '-x' starts with '-'"),
    (["time=1h"], "time '1h' does not parse"),
    (["cpus_per_proc=0"], "cpus_per_proc must be >= 1, got 0"),
    (["max_restarts=-1"], "max_restarts must be >= 0, got -1"),
    (["noequals"], "expected key=value"),
    (
        [
            "train.parallel=fsdp",
            "train.sharding=HYBRID_SHARD",
            "train.replicate_degree=3",
            "nodes=2",
            "nproc_per_node=2",
        ],
        "HYBRID_SHARD: replicate degree 3 does not divide world size 4 (4 % 3 = 1)",
    ),  # fmt: skip
    (["train.sharding=FULL_SHARD"], "--sharding FULL_SHARD needs --parallel fsdp"),
    # the trainer's own checks at render time, in its own words
    (["train.lr=-1"], "--lr must be > 0, got -1.0"),
    (["train.batch_size=0"], "--batch-size must be >= 1, got 0; pass a positive integer"),
    (
        ["train.model=gpt", "train.dataset=mnist"],
        "--model gpt trains on tokens data, --dataset mnist holds classes",
    ),
    # item 12/13: budgets and values a shell or sbatch would misread
    (["train.shutdown_timeout_s=inf"], "train.shutdown_timeout_s = inf must be a number"),
    (["train.shutdown_timeout_s=nan"], "train.shutdown_timeout_s = nan must be a number"),
    (["train.shutdown_timeout_s=1e400"], "train.shutdown_timeout_s = inf must be a number"),
    (
        ["image=--privileged"],
        "image '--privileged' is not an image reference (it must not start with '-'",
    ),
    (["train.run_dir=-rf"], "train.run_dir '-rf' starts with '-'"),
    # the entry point
    (["module=a.b", "script=c.py"], "set one entry point, not both"),
    (["module=a-b"], "is not a Python module path"),
    (["script=-x.py"], "is not a script path"),
    (["args=['--x']"], "args are the arguments of your own module/script"),
    (
        ["script=s.py", "train.lr=0.1"],
        "[train] lr: the kit trainer's flags do not reach your script",
    ),
]


@pytest.mark.parametrize(("sets", "message"), BAD)
def test_validation_errors(sets: list[str], message: str) -> None:
    with pytest.raises(SpecError) as e:
        load_spec(None, sets)
    assert message in str(e.value)


def test_a_kubernetes_render_with_a_long_shutdown_is_not_refused_by_slurm(tmp_path) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "ddpkit", "render", "k8s", "--set",
         "train.shutdown_timeout_s=300", "--set", "slurm.grace_s=120"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "terminationGracePeriodSeconds" in r.stdout


@pytest.mark.parametrize(
    "args",
    [["--nodes", "0"], ["--set", "slurm.bogus=1"], ["--set", "name=A B"], ["--gpus", "x"],
     ["--config", "nope.toml"]],
)  # fmt: skip
def test_cli_bad_input_one_line_exit_2(args: list[str], tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", "slurm", "--write", *args],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_cli_print_spec_round_trips(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", "slurm", "--print-spec",
         "--config", "configs/mnist_ddp.toml", "--nodes", "3", "--set", "env.A=1"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    spec = load_spec(write(tmp_path, out.stdout))
    assert spec.nodes == 3 and spec.env == {"A": "1"} and spec.name == "mnist-ddp"


@pytest.mark.parametrize("backend", ["k8s", "docker"])
def test_container_backends_do_not_look_up_input_paths_here(backend: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", backend, *_IN_CONTAINER],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "/data/owt-not-here" in r.stdout


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_shared_filesystem_backends_refuse_a_missing_input_path(backend: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", backend, *_IN_CONTAINER],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: --data-dir /data/owt-not-here does not exist; point it at your tokens data"
    ]
