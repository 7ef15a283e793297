"""JobSpec: TOML + overrides, precedence, and every validation error (exit 2, one line).

Here the tests that run in this process; those that start processes in
tests/process/launch/test_spec.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddpkit.tools.jobspec import SpecError, load_spec, node_command, parse_time_minutes

REPO = Path(__file__).resolve().parents[3]


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
