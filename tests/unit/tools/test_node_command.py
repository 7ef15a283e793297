"""The command every node runs is built once (tools/jobspec/command.py): an engine passes its
rendezvous and knobs, and what it renders is the builder's list as it is."""

from __future__ import annotations

import yaml
from ddpkit.docker import render as docker
from ddpkit.k8s import render as k8s
from ddpkit.slurm import render as slurm
from ddpkit.tools.backends import local
from ddpkit.tools.jobspec import load_spec, node_command, standalone

ENTRY = ["--", "-m", "ddpkit.train", "--name", "default"]


def test_the_node_launchers_command_takes_the_engines_rendezvous_and_budget():
    spec = load_spec(None, ["max_restarts=2"])
    argv = node_command(spec, ["--nnodes=2"], python="/v/bin/python")
    assert argv[:9] == [
        "/v/bin/python", "-m", "ddpkit.train.node", "--run-dir", "runs/default",
        "--shutdown-timeout", "30", "--nnodes=2", "--max-restarts=2",
    ]  # fmt: skip
    assert argv[9:14] == ENTRY
    assert node_command(spec, bare=True, max_restarts=0)[:5] == [
        "--run-dir", "runs/default", "--shutdown-timeout", "30", "--max-restarts=0"
    ]  # fmt: skip


def test_torchft_wraps_one_groups_standalone_launcher_in_the_supervisor():
    spec = load_spec(None, ["fault_tolerance=torchft", "train.ckpt_dir=s3://b/ck"], 2, 4)
    argv = node_command(
        spec, ["--nnodes=2"], nproc=3, nodes=2, node_rank_env="RANK_VAR", lighthouse=False
    )
    i = argv.index("--")
    assert argv[:i] == [
        "python", "-m", "ddpkit.train.replica_groups", "--groups", "2", "--nodes", "2",
        "--node-rank-env", "RANK_VAR", "--no-lighthouse", "--run-dir", "runs/default",
        "--ckpt-dir", "s3://b/ck",
    ]  # fmt: skip
    group = argv[i + 1 :]
    assert group[:3] == ["python", "-m", "ddpkit.train.node"]
    assert standalone(3) == group[7:9] and "--nnodes=2" not in group  # a group: alone
    plain = node_command(load_spec(None, ["fault_tolerance=torchft"]), bare=True)
    assert plain[:4] == ["--groups", "2", "--run-dir", "runs/default"]  # no knobs, no ckpt


def test_the_explicit_checkpoint_dir_is_the_jobs_or_its_trainers_else_none():
    assert load_spec(None).explicit_ckpt_dir is None
    assert load_spec(None).checkpoint_dir == "runs/default/checkpoints"
    assert load_spec(None, ["train.ckpt_dir=ck"]).explicit_ckpt_dir == "ck"
    spec = load_spec(None, ["ckpt_dir=a", "train.ckpt_dir=b"])
    assert spec.explicit_ckpt_dir == spec.checkpoint_dir == spec.launch_env()["DDPKIT_CKPT_DIR"]


def test_every_engine_renders_the_builders_command_unedited():
    torchft = ["fault_tolerance=torchft", "ckpt_dir=runs/ck"]
    spec = load_spec(None, torchft)
    assert local.node_argv(spec) == node_command(spec, standalone(1), python=local.sys.executable)
    spec = load_spec(None, torchft, 2, 2)
    assert slurm.node_argv(spec) == node_command(
        spec, python=slurm.node_python(spec), nodes=2, node_rank_env="SLURM_NODEID"
    )
    spec = load_spec(None, ["k8s.elastic.min=1", "k8s.elastic.max=2"], 2, 2)
    (job,) = [d for d in yaml.safe_load_all(k8s.render(spec)) if d["kind"] == "PyTorchJob"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    # an elastic job's own in-place budget, passed to the builder (never a rewritten flag)
    assert pod["containers"][0]["args"][2:] == node_command(spec, bare=True, max_restarts=3)
    spec = load_spec(None, torchft)
    assert docker.run_argv(spec)[-len(docker.node_args(spec)) :] == node_command(spec)
