"""JobSpec: TOML + overrides, precedence, and every validation error (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.jobspec import SpecError, load_spec, node_command, parse_time_minutes

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_precedence_defaults_file_set_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path, 'name = "a"\nnodes = 3\n[train]\nlr = 0.1\n[slurm]\npartition = "cpu"\n')
    spec = load_spec(cfg, ["slurm.partition=gpu", "train.lr=3e-4", "nodes=5"], nodes=2, gpus=4)
    assert (spec.name, spec.nodes, spec.nproc_per_node) == ("a", 2, 4)
    assert spec.slurm.partition == "gpu" and spec.train["lr"] == pytest.approx(3e-4)
    assert spec.world_size == 8
    assert spec.k8s.namespace == "default" and spec.docker.shm_size == "16g"  # defaults


def test_every_config_file_loads() -> None:
    for path in sorted((REPO / "configs").glob("*.toml")):
        spec = load_spec(path)
        assert spec.name and spec.train, path


def test_set_types_env_and_lists(tmp_path: Path) -> None:
    spec = load_spec(
        None,
        ["env.FOO=a b", "slurm.exclusive=true", "train.steps=7", "k8s.image_pull_secrets=a,b",
         "k8s.elastic.min=1", "k8s.elastic.max=2", "name=x-1", "mem=none"],
    )  # fmt: skip
    assert spec.env == {"FOO": "a b"} and spec.slurm.exclusive is True
    assert spec.train["steps"] == 7 and spec.k8s.image_pull_secrets == ["a", "b"]
    assert (spec.k8s.elastic.min, spec.k8s.elastic.max) == (1, 2) and spec.mem is None


def test_train_argv_passes_values_as_separate_words() -> None:
    spec = load_spec(None, ["train.eval=false", "train.run_dir=r d", "ckpt_dir=/c"])
    argv = spec.train_argv()
    assert argv[:2] == ["--name", "default"]
    assert "--no-eval" in argv and argv[argv.index("--run-dir") + 1] == "r d"
    assert argv[argv.index("--ckpt-dir") + 1] == "/c"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30", 30), ("1:30", 2), ("01:00:00", 60), ("2-00", 2880), ("1-02:03", 1563), ("0-0:0:59", 1)],
)
def test_time_formats(text: str, expected: int) -> None:
    assert parse_time_minutes(text) == expected


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


# A backend's own rules: its validate() refuses, and no other backend applies them.
BACKEND_BAD = [
    ("k8s", ["k8s.elastic.min=3", "k8s.elastic.max=2"], "1 <= min <= max"),
    ("k8s", ["k8s.shm_size=lots"], "k8s.shm_size 'lots' does not parse"),
    ("k8s", ["k8s.secret_env.TOKEN=nokey"], 'give NAME = "secret/key"'),
    ("k8s docker", ["ckpt_dir=/dev/shm/ck"], "collides with the mounted /dev/shm"),
    ("docker", ["docker.gpus=first"], 'use "all" or device ids'),
    ("docker", ["docker.shm_size=lots"], "docker.shm_size 'lots' does not parse"),
    ("slurm", ["slurm.grace_s=1"], "slurm.grace_s = 1 must cover the shutdown budget"),
]


@pytest.mark.parametrize(("backends", "sets", "message"), BACKEND_BAD)
def test_backend_rules_refuse_their_own_jobs_only(backends, sets, message) -> None:
    from ddpkit.tools.backends import BACKENDS, load_backend

    spec = load_spec(None, sets)  # the spec itself loads: the rule is not the spec's
    for backend in backends.split():
        with pytest.raises(SpecError) as e:
            load_backend(backend).validate(spec)
        assert message in str(e.value)
    for other in sorted(set(BACKENDS) - set(backends.split())):
        load_backend(other).validate(spec)


SLURM_BAD = [
    (["slurm.extra_sbatch=['--a\nb']"], "one sbatch option per entry"),
    (["slurm.grace_s=70000"], "slurm.grace_s = 70000 must cover the shutdown budget (30 s"),
    (
        ["train.shutdown_timeout_s=200", "slurm.grace_s=120"],
        "slurm.grace_s = 120 must cover the shutdown budget (200 s",
    ),
    (["slurm.log_dir=-x"], "slurm.log_dir '-x' starts with '-'"),
    (["slurm.rdzv_port=0"], "slurm.rdzv_port 0 is not a port; use 1-65535, or unset"),
    (["slurm.requeue_limit=-1"], "slurm.requeue_limit must be >= 0, got -1"),
]


@pytest.mark.parametrize(("sets", "message"), SLURM_BAD)
def test_slurm_rules_refuse_slurm_jobs_only(sets: list[str], message: str) -> None:
    from ddpkit.tools.backends import load_backend

    spec = load_spec(None, sets)  # a valid job for any backend ...
    for name in ("k8s", "docker", "local"):
        load_backend(name).validate(spec)
    with pytest.raises(SpecError) as e:  # ... but not for SLURM
        load_backend("slurm").validate(spec)
    assert message in str(e.value)


def test_the_slurm_grace_follows_the_shutdown_budget_unless_set() -> None:
    from ddpkit.slurm import backend as slurm

    spec = load_spec(None, ["train.shutdown_timeout_s=300"])
    assert slurm.grace_s(spec) == 300 + slurm.GRACE_MARGIN_S
    assert "--signal=USR1@360" in slurm.sbatch_options(spec)
    slurm.validate(spec)  # a longer save needs no second setting
    assert slurm.grace_s(load_spec(None, ["slurm.grace_s=500"])) == 500


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


def test_unknown_key_in_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown key 'slurm.qso'.*valid keys in \[slurm\]"):
        load_spec(write(tmp_path, "[slurm]\nqso = 'x'\n"))
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(write(tmp_path, "nodes = = 1\n"))
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.toml")


def test_hybrid_shard_default_degree_is_nodes() -> None:
    sets = ["train.parallel=fsdp", "train.sharding=HYBRID_SHARD"]
    assert load_spec(None, sets, nodes=2, gpus=3).world_size == 6
    with pytest.raises(SpecError, match="replicate degree 4 does not divide world size 2"):
        load_spec(None, [*sets, "train.replicate_degree=4"], nodes=2, gpus=1)


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


@pytest.mark.parametrize(
    "ifname,gloo",
    [("=eth0", "eth0"), ("eth", None), ("^lo,docker", None), ("=eth0,eth1", None)],
)
def test_gloo_gets_only_an_exact_interface_name(ifname, gloo):
    env = load_spec(None, [f"nccl_socket_ifname={ifname}"]).launch_env()
    assert env["NCCL_SOCKET_IFNAME"] == ifname
    assert env.get("GLOO_SOCKET_IFNAME") == gloo


# Input paths of the training job: looked up at render time only where the nodes see this
# machine's files. A container job's data exists in its image or volumes, not here.
_IN_CONTAINER = [
    "--set", "train.model=gpt", "--set", "train.dataset=tokens",
    "--set", "train.data_dir=/data/owt-not-here",
]  # fmt: skip


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


@pytest.mark.parametrize(
    ("train_args", "expect"),
    [
        ([], "runs/default"),
        (["--run-dir", "runs/t2", "--steps", "30"], "runs/t2"),
        (["--run-dir=runs/a", "--run-dir", "runs/b"], "runs/b"),  # argparse: the last wins
        (["--name", "exp1"], "runs/exp1"),
    ],
)
def test_the_run_dir_in_the_raw_flags_is_the_jobs_run_dir(train_args, expect) -> None:
    """make train ARGS='--run-dir runs/t2': the node log, the markers and the plots follow."""
    spec = load_spec(None, None, train_args=train_args)
    assert spec.run_dir == expect
    argv = node_command(spec)
    assert argv[argv.index("--run-dir") + 1] == expect


def test_a_job_file_with_a_utf8_byte_order_mark_loads(tmp_path) -> None:
    """Some Windows editors save UTF-8 with a BOM; tomllib alone reads it as a bad statement."""
    job = tmp_path / "ddpkit.toml"
    job.write_bytes(b'\xef\xbb\xbfname = "bom"\nnodes = 2\n')
    spec = load_spec(job)
    assert (spec.name, spec.nodes) == ("bom", 2)
