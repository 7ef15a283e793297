"""SLURM job management against fake scontrol/sacct/squeue on PATH (the process boundary):
status falls back to sacct when slurmctld forgot the job, list shows this kit's jobs only,
logs prefixes every node's lines. The real cluster covers submit/--wait/--follow
(tests/engines/slurm/test_slurm_e2e.py).

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_slurm_jobs.py. Helpers both use are in
tests/unit/backends/test_slurm_jobs.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import FakeBin
from tests.trainrun import clean_env
from tests.unit.backends.test_slurm_jobs import fake, launch


def test_status_falls_back_to_sacct(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", "slurm_load_jobs error: Invalid job id specified", rc=1)
    fake(bin_dir, "sacct", "4242|my-job|COMPLETED|0:0")
    p = launch(bin_dir, "status", "slurm", "4242")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        "job 4242: succeeded exit=0 JobName=my-job JobState=COMPLETED ExitCode=0:0 (from sacct)"
    )
    fake(bin_dir, "sacct", "4242|my-job|FAILED|1:0")
    assert launch(bin_dir, "status", "slurm", "4242").returncode == 1
    fake(bin_dir, "sacct", "", rc=1)  # no accounting on this cluster either
    p = launch(bin_dir, "status", "slurm", "4242")
    assert p.returncode == 1 and "unknown (neither slurmctld nor sacct knows it)" in p.stdout


# Run in the project: submit through a fake sbatch/sinfo and a fake nodes' Python (its import
# check passes at once), then name the heavy modules this process loaded.
SUBMIT_PROBE = """
import sys
from ddpkit.tools import submit
rc = submit.run(["submit", "slurm", "--set", "slurm.python=" + sys.argv[1]])
heavy = sorted(set(sys.modules) & {"submitit", "cloudpickle", "yaml", "torch", "importlib.metadata"})
print("RC", rc, "LOADED", heavy)
"""


def test_submit_sends_the_rendered_script_to_sbatch_with_no_submitit(tmp_path: Path) -> None:
    """`submit slurm` queues `render slurm`'s script byte for byte, so each node starts the
    node launcher with no submitit Python before it (issue 34: one interpreter fewer per
    node); the batch shell's log goes to the log dir, where `logs` reads it. The submitting
    process loads neither submitit nor yaml (only manifests need it), nor importlib.metadata
    (no plugin engine is installed here: a quick look at the path says so)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('hello')\n")
    (proj / "ddpkit.toml").write_text('name = "direct"\naccelerator = "cpu"\nscript = "train.py"\n')
    bin_dir = tmp_path / "bin"
    fakes = FakeBin(bin_dir)
    fake(bin_dir, "sinfo", "debug*|2|(null)|infinite|1-infinite")
    fakes.add("sbatch", f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.args\necho 4321\n')
    python = fakes.add("python", "#!/bin/sh\nexit 0\n")  # the nodes' Python: its checks pass
    env = clean_env(PATH=f"{bin_dir}:/usr/bin:/bin", USER="alice")
    r = subprocess.run([sys.executable, "-c", SUBMIT_PROBE, str(python)], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "RC 0 LOADED []", r.stdout + r.stderr
    assert "submitted job 4321 (direct: 1 node(s) x 1)" in r.stdout
    logs = proj / "runs" / "direct" / "slurm"
    args = (tmp_path / "sbatch.args").read_text().splitlines()
    assert args[:3] == [
        "--parsable",
        f"--output={logs}/%j_0_log.out",
        f"--error={logs}/%j_0_log.err",
    ]
    kept = logs / "4321_submission.sh"
    assert len(args) == 4 and Path(args[3]).parent == logs  # the script, kept under the job id
    render = subprocess.run(
        [sys.executable, "-m", "ddpkit.tools.submit", "render", "slurm", "--set",
         f"slurm.python={python}"],
        cwd=proj, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert kept.read_text() == render.stdout
    assert sorted(p.name for p in logs.iterdir()) == ["4321_submission.sh"]


def test_logs_prefix_every_node(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "77_0_log.out").write_text("step 1\nstep 2\n")
    (logs / "77_1_log.err").write_text("warning on node 1\n")
    fake(bin_dir, "scontrol", f"JobId=77 JobState=RUNNING StdErr={logs}/77_0_log.err")
    p = launch(bin_dir, "logs", "slurm", "77")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "[node 0] step 1", "[node 0] step 2", "[node 1 err] warning on node 1"]  # fmt: skip
    assert launch(bin_dir, "logs", "slurm", "77;rm").returncode == 2


def test_secrets_pass_by_name_only(tmp_path: Path) -> None:
    from ddpkit.slurm import backend as slurm
    from ddpkit.tools.jobspec import load_spec

    spec = load_spec(None, ["slurm.secret_env=['WANDB_API_KEY']"], 2, 1)
    text = slurm.render(spec)
    assert "printenv WANDB_API_KEY >/dev/null ||" in text and "sk-" not in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    p = launch(bin_dir, "submit", "slurm", "--set", "slurm.secret_env=['WANDB_API_KEY']")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "error: slurm.secret_env WANDB_API_KEY not set in this shell; export it before "
        "submitting (the value goes to the job by name, never into the script)"
    )
    # the batch shell refuses to start without it (plain sbatch route)
    setup = subprocess.run(["bash", "-c", slurm.setup_script(spec)], env={"PATH": "/usr/bin:/bin"},
                           cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert setup.returncode == 1 and "WANDB_API_KEY is not set" in setup.stderr
