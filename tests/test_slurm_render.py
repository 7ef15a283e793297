"""sbatch rendering: goldens (exact), shellcheck + bash -n, inert values, what a node runs.

Regenerate goldens only on purpose: DDPKIT_UPDATE_GOLDENS=1 pytest tests/test_slurm_render.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.backends import slurm
from tools.spec import JobSpec, SpecError, load_spec

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "slurm"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"

CASES: dict[str, tuple[str | None, list[str], int | None, int | None]] = {
    "default-2x2": ("configs/default.toml", [], 2, 2),
    "mnist-site": (
        "configs/mnist_ddp.toml",
        [
            "slurm.partition=gpu",
            "slurm.account=ml",
            "slurm.qos=high",
            "slurm.constraint=a100|h100",
            "slurm.exclusive=true",
            "mem=0",
            "time=1-00:00:00",
            "debug=info",
            "nccl_socket_ifname=^lo,docker",
            "nccl_ib_hca=mlx5",
            "slurm.setup=['module load cuda/12.4']",
            "slurm.extra_sbatch=['--mail-type=END']",
            "slurm.requeue_limit=5",
            "max_restarts=2",
        ],
        4,
        8,
    ),  # fmt: skip
    "gpt-pyxis": (
        "configs/gpt.toml",
        [
            "slurm.container=pyxis",
            "image=nvcr.io#org/ddpkit:1.0",
            "slurm.container_mounts=['/data:/data:ro']",
        ],
        2,
        8,
    ),  # fmt: skip
    "fsdp-apptainer-cpu": (
        "configs/mlp_fsdp.toml",
        [
            "slurm.container=apptainer",
            "image=/shared/ddpkit.sif",
            "accelerator=cpu",
            "slurm.requeue_limit=0",
            "slurm.signal=USR2",
            "slurm.grace_s=300",
        ],
        1,
        4,
    ),  # fmt: skip
}

PAYLOADS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "a\ntouch PWNED",
    "x;touch PWNED",
]


def spec_for(case: str) -> JobSpec:
    config, sets, nodes, gpus = CASES[case]
    return load_spec(REPO / config if config else None, sets, nodes, gpus)


def shellcheck(text: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    out = subprocess.run([str(SHELLCHECK), str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout
    subprocess.run(["bash", "-n", str(path)], check=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, tmp_path: Path) -> None:
    text = slurm.render(spec_for(case))
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("DDPKIT_UPDATE_GOLDENS") == "1":
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}; run with DDPKIT_UPDATE_GOLDENS=1 once"
    assert text == golden.read_text(), "rendering changed; review, then DDPKIT_UPDATE_GOLDENS=1"
    shellcheck(text, tmp_path)


def test_sbatch_lines_follow_the_spec() -> None:
    spec = spec_for("mnist-site")
    lines = [
        ln[len("#SBATCH ") :] for ln in slurm.render(spec).splitlines() if ln.startswith("#SBATCH ")
    ]
    assert lines == slurm.sbatch_options(spec)
    for expected in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=32",
                     "--partition=gpu", "--account=ml", "--qos=high", "--constraint=a100|h100",
                     "--exclusive", "--mem=0", "--time=1440", "--requeue", "--signal=USR1@120",
                     "--mail-type=END"):  # fmt: skip
        assert expected in lines
    cpu = spec_for("fsdp-apptainer-cpu")
    cpu_lines = slurm.sbatch_options(cpu)
    assert "--no-requeue" in cpu_lines and "--signal=USR2@300" in cpu_lines
    assert not any(x.startswith("--gpus-per-node") for x in cpu_lines)


def test_submitit_parameters_match_render() -> None:
    spec = spec_for("mnist-site")
    p = slurm.submitit_parameters(spec)
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (
        4,
        1,
        8,
        32,
    )
    assert p["time"] == 1440 and p["partition"] == "gpu" and p["mem"] == "0"
    assert p["additional_parameters"]["signal"] == "USR1@120"
    # The same setup and teardown shell as the rendered script, line for line.
    text = slurm.render(spec)
    assert "\n".join(p["setup"]) in text and "\n".join(p["teardown"]) in text
    assert slurm.node_script(spec) in text


def run_node_script(spec: JobSpec, tmp_path: Path, node_id: str = "0") -> tuple[int, dict]:
    """Run the rendered node script with a fake torchrun that records its argv and env."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['REC'], 'w'))\n"
        "sys.exit(int(os.environ.get('FAKE_RC', '0')))\n"
    )
    fake.chmod(0o755)
    rec = tmp_path / "rec.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "REC": str(rec), "SLURM_NODEID": node_id,
           "SLURM_JOB_ID": "42", "DDPKIT_HEAD_NODE": "node1", "HOME": str(tmp_path)}  # fmt: skip
    rc = subprocess.run(
        ["bash", "-c", slurm.node_script(spec)], cwd=tmp_path, env=env, check=False
    ).returncode
    return rc, json.loads(rec.read_text())


@pytest.mark.parametrize("payload", PAYLOADS)
def test_values_are_inert(payload: str, tmp_path: Path) -> None:
    spec = load_spec(None, [f"env.X={payload}", "slurm.container_mounts=['/a:/a']"], 2, 2,
                     train_args=["--progress", payload])  # fmt: skip
    spec.image = payload  # images are not validated: quoting alone must hold
    for container in ("none", "pyxis", "apptainer"):
        spec.slurm.container = container
        shellcheck(slurm.render(spec), tmp_path)
    spec.slurm.container = "none"
    rc, rec = run_node_script(spec, tmp_path)
    assert rc == 0 and not (tmp_path / "PWNED").exists()
    assert rec["env"]["X"] == payload
    argv = rec["argv"]
    assert argv[argv.index("-m") + 1 :] == ["train", *spec.train_argv()]
    assert argv[-1] == payload


def test_node_script_wires_torchrun(tmp_path: Path) -> None:
    spec = load_spec(REPO / "configs/default.toml", ["rdzv_port=29123", "debug=trace"], 2, 3)
    rc, rec = run_node_script(spec, tmp_path, node_id="1")
    argv, env = rec["argv"], rec["env"]
    for flag in ("--nnodes=2", "--nproc-per-node=3", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=node1:29123", "--rdzv-id=ddpkit-42-0", "--rdzv-conf=is_host=0",
                 "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"):  # fmt: skip
        assert flag in argv
    assert env["NCCL_DEBUG"] == "TRACE" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    _, rec0 = run_node_script(spec, tmp_path, node_id="0")
    assert "--rdzv-conf=is_host=1" in rec0["argv"]


def test_requeue_marker_turns_into_exit_75(tmp_path: Path) -> None:
    spec = load_spec(None, ["train.run_dir=run"], 1, 1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "requeue.json").write_text("{}")
    os.environ.get("FAKE_RC")
    rc, _ = run_node_script(spec, tmp_path)
    assert rc == slurm.EXIT_REQUEUE


def test_sbatch_line_values_must_be_plain() -> None:
    for bad in ("slurm.partition=gpu debug", "slurm.account=a'b", "train.run_dir=runs/$(x)"):
        with pytest.raises(SpecError, match="cannot go on an #SBATCH line"):
            slurm.render(load_spec(None, [bad]))


def test_render_cli_writes_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.launch", "render", "slurm", "--write", "--nodes", "2",
         "--set", "name=render-cli-test"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = REPO / "out" / "slurm" / "render-cli-test.sbatch"
    try:
        assert path.read_text() == out.stdout and "out/slurm/render-cli-test.sbatch" in out.stderr
    finally:
        path.unlink(missing_ok=True)
