"""sbatch rendering: goldens (exact), shellcheck + bash -n, inert values, what a node runs.

Regenerate goldens only on purpose:
DDPKIT_UPDATE_GOLDENS=1 pytest tests/unit/backends/test_slurm_render.py

Here the tests that run in this process; those that start processes in
tests/process/backends/test_slurm_render.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.slurm import backend as slurm
from ddpkit.tools.jobspec import JobSpec, SpecError, load_spec

from tests.conftest import FakeBin

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "slurm"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"

CASES: dict[str, tuple[str | None, list[str], int | None, int | None]] = {
    "default-2x2": ("configs/default.toml", [], 2, 2),
    # one replica group per node, each under the supervisor; the lighthouse on node 0
    "default-torchft-2x2": ("configs/default.toml", ["fault_tolerance=torchft"], 2, 2),
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
    # The machine's paths (the checkout as the workspace, this venv's Python as the nodes')
    # are placeholders in the goldens, so they hold on every clone.
    raw = slurm.render(spec_for(case))
    text = raw.replace(sys.executable, "<python>").replace(str(REPO), "<workspace>")
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("DDPKIT_UPDATE_GOLDENS") == "1":
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}; run with DDPKIT_UPDATE_GOLDENS=1 once"
    assert text == golden.read_text(), "rendering changed; review, then DDPKIT_UPDATE_GOLDENS=1"
    shellcheck(raw, tmp_path)


def test_sbatch_lines_follow_the_spec() -> None:
    spec = spec_for("mnist-site")
    lines = [
        ln[len("#SBATCH ") :] for ln in slurm.render(spec).splitlines() if ln.startswith("#SBATCH ")
    ]
    assert lines == slurm.sbatch_options(spec)
    for expected in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=32",
                     "--partition=gpu", "--account=ml", "--qos=high", "--constraint=a100|h100",
                     "--exclusive", "--mem=0", "--time=1440", "--requeue", "--signal=USR1@90",
                     "--mail-type=END"):  # fmt: skip
        assert expected in lines
    cpu = spec_for("fsdp-apptainer-cpu")
    cpu_lines = slurm.sbatch_options(cpu)
    assert "--no-requeue" in cpu_lines and "--signal=USR2@300" in cpu_lines
    assert not any(x.startswith("--gpus-per-node") for x in cpu_lines)


@pytest.mark.parametrize("case", sorted(CASES))
def test_submitit_writes_the_same_sbatch_options(case: str, tmp_path: Path) -> None:
    """One set of sbatch options feeds both routes: submitit's own sbatch text carries every
    #SBATCH option of the rendered script (besides --output: each route its own log file)."""
    from submitit.slurm.slurm import _make_sbatch_string

    spec = spec_for(case)
    p = slurm.submitit_parameters(spec)
    theirs = _make_sbatch_string(command="true", folder=tmp_path, **p)
    their_opts = {ln.removeprefix("#SBATCH ").replace("'", "") for ln in theirs.splitlines()
                  if ln.startswith("#SBATCH ")}  # fmt: skip
    ours = [o for o in slurm.sbatch_options(spec) if not o.startswith("--output")]
    assert set(ours) <= their_opts, set(ours) - their_opts
    # no option twice with two values (e.g. submitit's default --time=5 beside ours)
    keys = [o.split("=")[0] for o in their_opts]
    assert len(keys) == len(set(keys)), sorted(keys)
    # the same setup and teardown shell as the rendered script, line for line
    text = slurm.render(spec)
    assert "\n".join(p["setup"]) in text and "\n".join(p["teardown"]) in text
    assert slurm.node_script(spec) in text


def recording_fake(tmp_path: Path, name: str, rc: int = 0) -> Path:
    """A fake command on PATH that records its argv and environment to <tmp>/<name>.json."""
    bins = FakeBin(tmp_path / "bin")
    bins.add(
        name,
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, "
        f"open({str(tmp_path / (name + '.json'))!r}, 'w'))\n"
        f"sys.exit({rc})\n",
    )
    return bins.path


def run_node_script(spec: JobSpec, tmp_path: Path, node_id: str = "0") -> tuple[int, dict]:
    """Run the rendered node script with a fake `python` (the node launcher) that records."""
    bin_dir = recording_fake(tmp_path, "python")
    spec.slurm.python = "python"  # the fake on PATH stands for the submitting interpreter
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_NODEID": node_id, "SLURM_JOB_ID": "42",
           "DDPKIT_HEAD_ADDR": "10.1.2.3", "DDPKIT_RDZV_PORT": "20042", "HOME": str(tmp_path),
           "DDPKIT_LAUNCH_ID": "ddpkit-42-0"}  # fmt: skip
    rc = subprocess.run(
        ["bash", "-c", slurm.node_script(spec)], cwd=tmp_path, env=env, check=False
    ).returncode
    return rc, json.loads((tmp_path / "python.json").read_text())


def run_setup(spec: JobSpec, tmp_path: Path, job_id: str = "123457") -> dict[str, str]:
    """Run the batch shell's setup with a fake scontrol (NodeName node7, NodeAddr 10.9.8.7)."""
    bins = FakeBin(tmp_path / "bin")
    bins.add(
        "scontrol",
        '#!/bin/bash\nif [ "$2" = hostnames ]; then echo node7; echo node8; exit 0; fi\n'
        'echo "NodeName=node7 Arch=x86_64 NodeAddr=10.9.8.7 NodeHostName=node7"\n',
    )
    bin_dir = bins.path
    script = slurm.setup_script(spec) + "\nenv\n"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job_id,
           "SLURM_JOB_NODELIST": "node[7-8]", "HOME": str(tmp_path)}  # fmt: skip
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return dict(ln.split("=", 1) for ln in out.stdout.splitlines() if "=" in ln)


@pytest.mark.parametrize("restarts", ["", "0", "2"])
def test_a_requeued_run_spends_its_earlier_incarnations_step_ids_first(tmp_path, restarts):
    """Requeue r runs r short steps before its own: a late signal for an earlier incarnation's
    step (the same job id, step ids from 0 again) finds no step of this one under that id."""
    calls = tmp_path / "srun.calls"
    bins = FakeBin(tmp_path / "bin")
    bins.add("srun", f'#!/bin/sh\necho "$*" >> {calls}\n')
    bins.add("scontrol", "#!/bin/sh\necho NodeAddr=10.9.8.7\n")
    spec = load_spec(None, ["train.run_dir=run"], 2, 2)
    script = slurm.setup_script(spec)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node[7-8]", "HOME": str(tmp_path),
           **({"SLURM_RESTART_COUNT": restarts} if restarts else {})}  # fmt: skip
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                   text=True, check=True)  # fmt: skip
    said = calls.read_text().splitlines() if calls.exists() else []
    assert said == ["--nodes=1 --ntasks=1 --cpus-per-task=1 true"] * int(restarts or 0)


def test_setup_resolves_head_address_port_per_job_and_srun_cpus(tmp_path: Path) -> None:
    # NodeAddr (the NodeName need not resolve), a port from the job
    # id (two jobs on one node do not collide), --cpus-per-task for srun again (22.05-23.02).
    spec = load_spec(None, ["train.run_dir=run"], 2, 2)
    env = run_setup(spec, tmp_path)
    assert env["DDPKIT_HEAD_ADDR"] == "10.9.8.7"
    assert env["DDPKIT_RDZV_PORT"] == str(20000 + 123457 % 20000)
    assert run_setup(spec, tmp_path, "123458")["DDPKIT_RDZV_PORT"] == str(20000 + 123458 % 20000)
    assert env["SRUN_CPUS_PER_TASK"] == "8"
    assert env["DDPKIT_LAUNCH_ID"] == "ddpkit-123457-0"  # one id per attempt, every node
    assert (tmp_path / "run" / "slurm").is_dir()  # made before any srun --output opens there
    fixed = load_spec(None, ["train.run_dir=run", "slurm.rdzv_port=29400"], 2, 2)
    assert run_setup(fixed, tmp_path)["DDPKIT_RDZV_PORT"] == "29400"


def test_srun_gets_cpus_kill_on_bad_exit_and_a_wait_beyond_the_budget() -> None:
    # on both routes (rendered sbatch and submitit)
    spec = load_spec(None, ["train.shutdown_timeout_s=90.2", "slurm.grace_s=200"], 2, 4)
    text = slurm.render(spec)
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    for flag in ("--cpus-per-task=16", "--kill-on-bad-exit=1", "--wait=121"):
        assert flag in srun
        assert flag in slurm.submitit_parameters(spec)["srun_args"]
    assert "--shutdown-timeout 91" in text  # rounded up, never down to 0


def test_the_exclusion_leaves_the_job_room_in_its_partition(tmp_path: Path, monkeypatch) -> None:
    """A 2-node job on a 3-node partition: a second node that failed twice is not excluded
    (the job would stay pending for good, BadConstraints: found by a 15-minute drill); a node
    that is down costs no room; without sinfo every bad node is added as before."""
    from ddpkit.slurm import room

    bin_ = FakeBin(tmp_path / "bin")
    bin_.add("sinfo", '#!/bin/sh\n[ "$6" = gpu ] || exit 1\n'
                      'printf "n1 idle\\nn2 mix\\nn3 alloc\\nn4 down*\\nn5 drain\\n"\n')  # fmt: skip
    bin_.add("scontrol", '#!/bin/sh\nshift 2; echo "$@" | tr , "\\n"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu")
    assert room.usable_nodes("gpu") == {"n1", "n2", "n3"}
    assert room.exclusion("(null)", ["n1"]) == ([], ["n1"], [])
    assert room.exclusion("n1", ["n2"]) == (["n1"], [], ["n2"])  # one usable node would be left
    assert room.exclusion("", ["n4", "n2", "n3"]) == ([], ["n4", "n2"], ["n3"])
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert room.exclusion("n1", ["n2"]) == (["n1"], ["n2"], [])
    monkeypatch.setenv("PATH", "/nonexistent")  # no SLURM commands: added as they are
    assert room.exclusion("n1", ["n2", "n3"]) == (["n1"], ["n2", "n3"], [])


def test_only_the_kits_own_signal_asks_for_a_requeue_on_slurm(tmp_path: Path) -> None:
    for signal, expect in (("USR1", "SIGUSR1"), ("USR2", "SIGUSR2")):
        spec = load_spec(None, ["train.run_dir=run", f"slurm.signal={signal}"], 1, 1)
        _, seen = run_node_script(spec, tmp_path)
        assert seen["env"]["DDPKIT_REQUEUE_SIGNALS"] == expect  # SIGTERM (scancel): a cancel
    with pytest.raises(SpecError, match="cannot be told from a plain `scancel`"):
        slurm.validate(load_spec(None, ["slurm.signal=TERM"], 1, 1))


@pytest.mark.parametrize(
    "image,ref",
    [("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
     ("localhost:5000/ddpkit:1", "localhost:5000#ddpkit:1"),
     ("ghcr.io/org/ddpkit:latest", "ghcr.io#org/ddpkit:latest"),
     ("ddpkit:latest", "ddpkit:latest"), ("org/ddpkit:1", "org/ddpkit:1"),
     ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
     ("/shared/ddpkit.sqsh", "/shared/ddpkit.sqsh")],
)  # fmt: skip
def test_pyxis_image_reference(image: str, ref: str) -> None:
    # enroot wants registry#image
    assert slurm.enroot_ref(image) == ref


def test_image_cache_converts_once(tmp_path: Path) -> None:
    sets = ["slurm.container=pyxis", "image=nvcr.io/nvidia/pytorch:24.01-py3",
            "slurm.image_cache=/shared/images"]  # fmt: skip
    text = slurm.render(load_spec(None, sets, 2, 2))
    assert "DDPKIT_IMAGE=/shared/images/nvcr.io+nvidia+pytorch+24.01-py3.sqsh" in text
    assert ("enroot import -o \"$DDPKIT_IMAGE.tmp.$SLURM_JOB_ID\" "
            "'docker://nvcr.io#nvidia/pytorch:24.01-py3'") in text  # fmt: skip
    assert '--container-image="$DDPKIT_IMAGE"' in text
    apptainer = slurm.render(load_spec(None, [*sets[1:], "slurm.container=apptainer"], 2, 2))
    assert "DDPKIT_IMAGE=/shared/images/nvcr.io+nvidia+pytorch+24.01-py3.sif" in apptainer
    assert 'apptainer pull "$DDPKIT_IMAGE.tmp.$SLURM_JOB_ID" docker://nvcr.io/nvidia' in apptainer
    assert 'exec apptainer exec --nv "$DDPKIT_IMAGE" python -m ddpkit.train.node' in apptainer
    shellcheck(apptainer, tmp_path)


def test_sbatch_line_values_must_be_plain() -> None:
    for bad in ("slurm.partition=gpu debug", "slurm.account=a'b", "train.run_dir=runs/$(x)"):
        with pytest.raises(SpecError, match="cannot go on an #SBATCH line"):
            slurm.render(load_spec(None, [bad]))


@pytest.mark.parametrize(
    "value", ["-lead 'q' $(touch PWNED) `x` back\\slash\nnext é \x85\u2028 \udcff", "-raw"]
)
def test_the_kit_trainers_data_dir_and_env_reach_it_byte_for_byte(value, tmp_path) -> None:
    """Through the rendered node script (what every node runs): the env value and --data-dir
    as the trainer's own parser reads them back, a leading dash included."""
    from ddpkit.train.config import parse_config

    spec = load_spec(None, [f"env.X={value}", f"train.data_dir={value}"], 1, 2)
    rc, rec = run_node_script(spec, tmp_path)
    assert rc == 0 and rec["env"]["X"] == value and not (tmp_path / "PWNED").exists()
    entry = rec["argv"][rec["argv"].index("--") + 1 :]
    cfg, _ = parse_config(entry[2:], world=(2, 1), installed=False, local_paths=False)
    assert cfg.data_dir == value
