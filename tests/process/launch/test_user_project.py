"""ddpkit as users run it: a project of their own in a temporary directory OUTSIDE the kit,
with its own train.py, a tools/ package, a utils.py its script imports and a model package,
driven by the installed `ddpkit` command from that directory.

Every test here starts the command; those on a real SLURM cluster are in
tests/engines/slurm/test_user_project.py (which imports the helpers here)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)  # noqa: F401  (fixture)

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install

TRAIN_PY = '''\
"""The user's own plain DDP script: it knows nothing of ddpkit."""
import argparse, json, os
import torch, torch.distributed as dist
from utils import seed_everything   # the project's own module, next to this script
from tools.helpers import out_path  # the project's own tools/ package

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()
dist.init_process_group("gloo")
seed_everything(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
if dist.get_rank() == 0:
    os.makedirs(os.path.dirname(out_path()), exist_ok=True)
    json.dump({"world_size": dist.get_world_size()}, open(out_path(), "w"))
dist.destroy_process_group()
'''
UTILS_PY = "import torch\n\ndef seed_everything(s):\n    torch.manual_seed(s)\n"
HELPERS_PY = 'def out_path():\n    return "runs/user/result.json"\n'
NET_PY = """\
import torch

def build(cfg, width=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 2))

def data(cfg):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = (x.sum(1) > 0).long()
    pairs = list(zip(x, y))
    return pairs[:448], pairs[448:]
"""
SCRIPT_JOB = 'name = "user"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\nargs = ["--steps", "5"]\n'
KIT_JOB = """\
name = "kit"
nproc_per_node = 2
accelerator = "cpu"
max_restarts = 1
[train]
model = "mymodels.net:build"
dataset = "mymodels.net:data"
parallel = "fsdp"
sharding = "FULL_SHARD"
batch_size = 16
steps = 12
ckpt_interval = 3
log_interval = 3
eval = false
"""


def make_project(root: Path) -> Path:
    (root / "tools").mkdir(parents=True)
    (root / "mymodels").mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "utils.py").write_text(UTILS_PY)
    (root / "tools" / "__init__.py").write_text("")
    (root / "tools" / "helpers.py").write_text(HELPERS_PY)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "net.py").write_text(NET_PY)
    (root / "ddpkit.toml").write_text(SCRIPT_JOB)
    (root / "kit.toml").write_text(KIT_JOB)
    return root


def ddpkit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600):
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing set by hand
    return subprocess.run(
        [str(DDPKIT), *args], cwd=cwd, env={**base, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


REPO = Path(__file__).resolve().parents[3]


def kit_files_written_since(t0: float) -> list[str]:
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "ddpkit.egg-info"}
    out = []
    for p in REPO.rglob("*"):
        if skip & set(p.relative_to(REPO).parts) or not p.is_file():
            continue
        if p.stat().st_mtime > t0 and p.relative_to(REPO).parts[0] in ("runs", ".ddpkit"):
            out.append(str(p.relative_to(REPO)))
    return out


@pytest.mark.slow
def test_the_users_own_train_py_runs_unchanged_from_its_project(tmp_path):
    t0 = time.time()
    proj = make_project(tmp_path / "proj")
    r = ddpkit("run", cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((proj / "runs/user/result.json").read_text()) == {"world_size": 2}
    record = json.loads((proj / ".ddpkit/jobs/local/last_job.json").read_text())
    assert Path(proj / record["run_dir"]).resolve() == (proj / "runs/user").resolve()
    assert (proj / "runs/user/local/node-0.log").is_file()
    st = ddpkit("status", "local", cwd=proj)  # the record is the workspace's
    assert st.returncode == 0 and "succeeded" in st.stdout, st.stdout + st.stderr
    assert kit_files_written_since(t0) == []


@pytest.mark.slow
def test_the_users_model_by_import_path_resumes_bitwise_after_a_sigkill(tmp_path):
    proj = make_project(tmp_path / "proj")
    ref = ddpkit("run", "--config", "kit.toml", "--set", "train.run_dir=runs/ref", cwd=proj)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    run = ddpkit(
        "run", "--config", "kit.toml", cwd=proj, env={"DDPKIT_FAULT": "kill@8:1"}
    )  # rank 1 SIGKILLs itself before step 8; torchrun (max_restarts 1) restarts the group
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[fault injection] kill on rank 1 at step 8" in run.stdout + run.stderr
    a = json.loads((proj / "runs/ref/summary.json").read_text())
    b = json.loads((proj / "runs/kit/summary.json").read_text())
    assert b["resumed_from"].endswith("step-6") and b["world_size"] == 2
    assert a["param_digest"] == b["param_digest"]
    assert "ddpkit: goodput " in run.stdout and ": 1 failure, " in run.stdout
    st = ddpkit("status", "local", cwd=proj)  # the goodput and the failure, from the run dir
    assert "failure: killed rank 1 (node 0, host " in st.stdout and "recovered" in st.stdout, (
        st.stdout
    )


@pytest.mark.parametrize(
    ("backend", "sets", "expect"),
    [
        ("local", ["train.model=mymodels.nope:build"], "train.model 'mymodels.nope:build' does not import"),
        ("slurm", ["train.model=mymodels.nope:build"], "train.model 'mymodels.nope:build' does not import"),
        ("slurm", ["train.dataset=mymodels.net:missing"], "train.dataset 'mymodels.net:missing' does not import"),
        ("slurm", ["slurm.venv=no-such-venv"], "slurm.python 'no-such-venv/bin/python' is not an executable"),
        ("local", ["script=nope.py", "train={}"], "script 'nope.py' is not a file in the workspace"),
    ],
)  # fmt: skip
def test_what_would_fail_on_the_nodes_is_refused_at_submit_in_one_line(
    tmp_path, backend, sets, expect
):
    proj = make_project(tmp_path / "proj")
    config = "ddpkit.toml" if sets[0].startswith("script") else "kit.toml"
    args = [x for s in sets for x in ("--set", s)]
    r = ddpkit("submit", backend, "--config", config, *args, cwd=proj)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (proj / "runs").exists()


def venv_with(venv: Path, wheel: Path) -> tuple[Path, Path]:
    """A fresh venv with `wheel` installed without its dependencies, which it finds in this
    venv's site-packages; returns (venv, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and "ddpkit" not in p)
    (site / "deps.pth").write_text(here + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
         "--no-deps", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return venv, site


def test_the_wheel_holds_only_the_ddpkit_namespace_and_its_command_runs(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = wheels.glob("ddpkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ddpkit"}
    assert "ddpkit/slurm/sbatch.sh.j2" in names and "ddpkit/k8s/launch.sh" in names
    assert "ddpkit/docker/Dockerfile" in names and "ddpkit/configs/default.toml" in names
    # A fresh venv, the wheel without its dependencies beside the ones this venv has.
    venv, site = venv_with(tmp_path / "venv", wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(venv / "bin/ddpkit"), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "init " in r.stdout and "submit " in r.stdout, r.stderr
    proj = make_project(tmp_path / "proj")
    r = subprocess.run(
        [str(venv / "bin/ddpkit"), "render", "slurm", "--nodes", "2"],
        cwd=proj, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert str(venv / "bin/python") in r.stdout and f"--chdir={proj}" in r.stdout
    probe = "import ddpkit.train.config, sys; print(ddpkit.train.config.__file__)"
    r = subprocess.run([str(venv / "bin/python"), "-c", probe], cwd=proj, env=env,
                       capture_output=True, text=True)  # fmt: skip
    assert str(site) in r.stdout, r.stdout + r.stderr
    # `ddpkit build` from the installed kit: the image's context holds the Dockerfile, the
    # entrypoint (executable), the job files and the kit packed again from its installed
    # files (no checkout to build from), and no revision of whatever repository holds the venv.
    ctx = tmp_path / "ctx"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=u", "-c", "user.email=u@x"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the user's repo"], check=True)
    stage = (
        "import sys; from pathlib import Path; from ddpkit.docker import image as d; "
        "d.stage_kit_context(Path(sys.argv[1])); print(repr(d._git('rev-parse', 'HEAD')))"
    )
    r = subprocess.run([str(venv / "bin/python"), "-c", stage, str(ctx)], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "''", r.stdout + r.stderr
    assert (ctx / "docker/Dockerfile").is_file() and (ctx / "configs/default.toml").is_file()
    assert os.access(ctx / "docker/entrypoint.sh", os.X_OK)
    (repacked,) = (ctx / "wheels").glob("ddpkit-*.whl")
    again = set(zipfile.ZipFile(repacked).namelist())
    assert {n for n in names if not n.endswith("RECORD")} <= again
    # ... and it installs (what the Dockerfile does with it) into another fresh venv.
    venv2, _ = venv_with(tmp_path / "venv2", repacked)
    r = subprocess.run([str(venv2 / "bin/ddpkit"), "render", "local"], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "ddpkit.train.node" in r.stdout, r.stderr


TOPLEVEL_MODULE = """\
import os
import shlex
import socket
with open("touched.txt", "a") as f:  # top-level code, no __main__ guard (torchrun -m runs it)
    f.write(os.environ.get("RANK", "no-rank") + "\\n")
"""


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
@pytest.mark.parametrize(
    ("entry", "broken", "where"),
    [
        ("script", "train.py", "train.py:3:"),
        ("module", "mymodels/net.py", "mymodels/net.py:3:"),
    ],
)
def test_an_entry_point_that_does_not_compile_is_refused_before_render_and_queue(
    tmp_path, one_line_error, backend, entry, broken, where
):
    proj = make_project(tmp_path / "proj")
    (proj / broken).write_text("import os\n\nx = (1,\n")
    sets = ["--set", "script=train.py" if entry == "script" else "module=mymodels.net"]
    job = ["--config", "ddpkit.toml" if entry == "script" else "kit.toml", "--set", "train={}"]
    for action in ("render", "submit") if backend in ("local", "slurm") else ("render",):
        line = one_line_error(ddpkit(action, backend, *job, *sets, cwd=proj))
        assert line.startswith(f"error: {where} SyntaxError"), line
        assert f"{entry} " in line and "does not compile with" in line, line
    assert not (proj / "runs").exists() and not (proj / ".ddpkit").exists()


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_a_missing_entry_point_is_refused_by_every_backend(tmp_path, one_line_error, backend):
    proj = make_project(tmp_path / "proj")
    line = one_line_error(ddpkit("render", backend, "--set", "script=nope.py", cwd=proj))
    assert "script 'nope.py' is not a file in the workspace" in line, line
    args = ["--config", "kit.toml", "--set", "train={}", "--set", "module=mymodels.nope"]
    line = one_line_error(ddpkit("render", backend, *args, cwd=proj))
    assert "module 'mymodels.nope' is not found" in line and "mymodels.nope" in line, line


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_the_entry_module_is_never_run_by_the_check(tmp_path, backend):
    """A module with top-level code (no __main__ guard) and a package __init__ with side
    effects: render checks it without running either."""
    proj = make_project(tmp_path / "proj")
    (proj / "mymodels" / "__init__.py").write_text(TOPLEVEL_MODULE)
    (proj / "mymodels" / "job.py").write_text(TOPLEVEL_MODULE)
    args = ["--config", "kit.toml", "--set", "train={}", "--set", "module=mymodels.job"]
    r = ddpkit("render", backend, *args, cwd=proj)
    assert r.returncode == 0, r.stderr
    assert not (proj / "touched.txt").exists()


@pytest.mark.slow
def test_a_module_with_top_level_code_runs_only_on_the_ranks(tmp_path):
    proj = make_project(tmp_path / "proj")
    (proj / "mymodels" / "job.py").write_text(TOPLEVEL_MODULE)
    args = ["--config", "kit.toml", "--set", "train={}", "--set", "module=mymodels.job"]
    r = ddpkit("run", *args, cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted((proj / "touched.txt").read_text().split()) == ["0", "1"]


@pytest.mark.slow
def test_run_a_script_without_a_job_file_like_torchrun(tmp_path):
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").unlink()
    (proj / "kit.toml").unlink()
    r = ddpkit("run", "train.py", "--gpus", "2", "--set", "accelerator=cpu", "--",
               "--steps", "2", cwd=proj)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((proj / "runs/user/result.json").read_text()) == {"world_size": 2}
    assert (proj / "runs/train/local/node-0.log").is_file()  # the job is named after it
    assert "built-in demo" not in r.stdout + r.stderr


@pytest.mark.slow
def test_run_without_a_job_file_or_script_says_it_runs_the_demo(tmp_path):
    r = ddpkit("run", "--set", "accelerator=cpu", "--set", "train.steps=2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert "no ddpkit.toml here: running the kit's built-in demo job" in first, r.stdout
    assert "`ddpkit run train.py` runs your script" in first


@pytest.mark.parametrize("entry", ["kit", "script"])
def test_train_name_gives_one_run_dir_whichever_way_the_job_starts(tmp_path, entry):
    """train.name in a job file: runs/<train.name> through the launcher (every backend's
    run dir and the trainer's --name), as `python -m ddpkit.train --config` reads it."""
    proj = make_project(tmp_path / "proj")
    body = KIT_JOB if entry == "kit" else SCRIPT_JOB
    (proj / "job.toml").write_text(
        body + ("" if entry == "kit" else "[train]\n") + 'name = "mine"\n'
    )
    for backend in ("local", "slurm", "k8s"):
        r = ddpkit("render", backend, "--config", "job.toml", cwd=proj)
        assert r.returncode == 0, r.stderr
        assert "runs/mine" in r.stdout and "runs/kit" not in r.stdout, r.stdout
        assert "runs/user" not in r.stdout
    if entry == "kit":
        local = ddpkit("render", "local", "--config", "job.toml", cwd=proj).stdout
        assert "--name mine" in local, local
        t = ddpkit("train", "--config", "job.toml", "--print-config", cwd=proj)
        assert t.returncode == 0, t.stderr
        assert json.loads(t.stdout)["run_dir"] == "runs/mine"


@pytest.mark.slow
def test_a_refused_second_submit_changes_no_record(tmp_path):
    """A second local job whose checkpoint dir is the running job's (through a symlink) is
    refused before its workers start; `ddpkit status` and `cancel` still find the first,
    which then ends (saved)."""
    proj = make_project(tmp_path / "proj")
    # One rank, its steps paced (0.25 s each, the rest asleep): nothing here depends on the
    # count or the speed, and unpaced the long job kept the cores busy until its cancel.
    long_job = (
        KIT_JOB.replace("steps = 12", "steps = 100000")
        .replace("max_restarts = 1", "")
        .replace("nproc_per_node = 2", "nproc_per_node = 1")
    )
    (proj / "kit.toml").write_text(long_job)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DDPKIT_STEP_PACE_S"] = "0.25"
    first = subprocess.Popen(
        [str(DDPKIT), "run", "--config", "kit.toml"], cwd=proj, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        lock, deadline = proj / "runs/kit/checkpoints/.lock", time.monotonic() + 300
        while not lock.is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lock.is_file(), "the first job never took its checkpoint dir"
        record = (proj / ".ddpkit/jobs/local/last_job.json").read_text()
        (proj / "linked").symlink_to(proj / "runs/kit/checkpoints")
        second = ddpkit("run", "--config", "kit.toml", "--set", "name=other",
                        "--set", "ckpt_dir=linked", cwd=proj)  # fmt: skip
        assert second.returncode == 2 and "is in use by another job" in second.stdout
        # refused by the node launcher before any worker started (no rank's start-up taken
        # from the first job's CPU): the second run has no goodput attempt
        assert not (proj / "runs/other/goodput").exists()
        assert (proj / ".ddpkit/jobs/local/last_job.json").read_text() == record
        st = ddpkit("status", "local", cwd=proj)
        assert st.returncode == 0 and f"job {json.loads(record)['job']}: running" in st.stdout
        assert ddpkit("cancel", "local", cwd=proj).returncode == 0
        assert first.wait(timeout=120) in (0, 75, 143), "the first job did not end"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


LEAVES_EARLY_PY = """\
import datetime, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
# a dataset whose length differs per rank: rank 1 runs out first and returns
for step in range(20 if dist.get_rank() == 1 else 10000):
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_rank_that_left_early_with_exit_0_is_named_by_the_launcher_report_and_status(
    tmp_path,
):
    """Issue 31 item 14, as found: a user's script whose rank 1 returns (exit 0) while rank 0
    still calls collectives. The launcher's line, goodput.json and `ddpkit status` all name
    rank 1 and where it ran, not rank 0, the first to fail."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(LEAVES_EARLY_PY)
    r = ddpkit("run", "train.py", "--gpus", "2", "--set", "accelerator=cpu",
               "--set", "max_restarts=0", cwd=proj, timeout=300)  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    here = f"(node 0, host {socket.gethostname()})"
    said = (
        f"ddpkit node: rank 1 {here} left first (exit 0) while the others still ran; "
        f"rank 0 {here} then failed"
    )
    lines = (r.stdout + r.stderr).splitlines()
    assert any(x.startswith(said) for x in lines), (r.stdout + r.stderr)[-3000:]
    (left,) = json.loads((proj / "runs/train/goodput.json").read_text())["failures"]
    assert (left["kind"], left["rank"], left["node_number"]) == ("left early", 1, 0), left
    st = ddpkit("status", "local", cwd=proj)
    assert f"failure: left early rank 1 {here} in attempt 0" in st.stdout, st.stdout


# --- where a script saves: DDPKIT_CKPT_DIR for every entry point (issue 31 item 2) -----------

SAVES_PY = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    ckpt = os.environ["DDPKIT_CKPT_DIR"]
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(ckpt, "last.txt"), "w") as f:
        f.write(os.environ["DDPKIT_RUN_DIR"])
dist.barrier()  # without it rank 1 could leave while rank 0 still connected its gloo pairs
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_init_writes_ckpt_dir_and_the_script_finds_it_in_its_environment(tmp_path):
    proj = tmp_path / "saver"
    proj.mkdir()
    (proj / "train.py").write_text(SAVES_PY)
    assert ddpkit("init", cwd=proj).returncode == 0
    text = (proj / "ddpkit.toml").read_text()
    assert 'ckpt_dir = "runs/saver/checkpoints"' in text and "$DDPKIT_CKPT_DIR" in text
    (proj / "ddpkit.toml").write_text(text.replace('# accelerator = "cpu"', 'accelerator = "cpu"'))
    r = ddpkit("run", cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (proj / "runs/saver/checkpoints/last.txt").read_text() == "runs/saver"
    other = ddpkit("run", "--set", "ckpt_dir=elsewhere", cwd=proj)
    assert other.returncode == 0, other.stdout + other.stderr
    assert (proj / "elsewhere/last.txt").is_file()


def test_init_writes_a_job_file_that_runs_the_detected_script(tmp_path):
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").unlink()
    r = ddpkit("init", cwd=proj)
    assert r.returncode == 0, r.stderr
    text = (proj / "ddpkit.toml").read_text()
    assert 'script = "train.py"' in text and 'name = "proj"' in text
    spec = ddpkit("render", "local", "--print-spec", cwd=proj)
    assert spec.returncode == 0 and f'workspace = "{proj}"' in spec.stdout, spec.stderr
    again = ddpkit("init", cwd=proj)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert (proj / "ddpkit.toml").read_text() == text  # nothing overwritten


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["run", "--epochs", "2"], "ddpkit run -- --epochs 2"),
        (["run", "train.py", "--steps=3", "--nodes", "1"], "ddpkit run train.py --nodes 1 -- --steps=3"),
        (["submit", "slurm", "train.py", "--nodes", "2", "--steps", "3"], "ddpkit submit slurm train.py --nodes 2 -- --steps 3"),
    ],
)  # fmt: skip
def test_flags_for_the_script_before_dashdash_get_the_fix_in_one_line(
    tmp_path, one_line_error, argv, fix
):
    proj = make_project(tmp_path / "proj")
    line = one_line_error(ddpkit(*argv, cwd=proj))
    assert "unrecognized arguments" in line and line.endswith(f"after `--`: {fix}"), line
    assert not (proj / "runs").exists() and not (proj / ".ddpkit").exists()


def test_run_help_shows_the_script_and_its_flags_after_dashdash(tmp_path):
    r = ddpkit("run", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "[script] [-- ARGS ...]" in " ".join(r.stdout.split())
    assert "ddpkit run train.py -- --epochs 2" in " ".join(r.stdout.split())
    s = ddpkit("submit", "--help", cwd=tmp_path)
    assert s.returncode == 0 and "[-- ARGS ...]" in s.stdout, s.stdout


@pytest.mark.parametrize(
    ("value", "argv"),
    [
        ("--steps 3 --tag 'a b'", ["--steps", "3", "--tag", "a b"]),
        ('["--steps", "3 4"]', ["--steps", "3 4"]),
    ],
)
def test_set_args_is_split_as_a_shell_would(tmp_path, value, argv):
    proj = make_project(tmp_path / "proj")
    r = ddpkit("render", "local", "--set", f"args={value}", cwd=proj)
    assert r.returncode == 0, r.stderr
    words = shlex.split(r.stdout.strip().splitlines()[-1])
    assert words[words.index("train.py") + 1 :] == argv


def test_set_args_with_an_open_quote_is_one_line(tmp_path, one_line_error):
    line = one_line_error(ddpkit("render", "local", "--set", "args=--x 'a", cwd=tmp_path))
    assert "does not split into arguments" in line and "fix the quotes" in line, line


def test_a_positional_that_is_no_script_is_refused(tmp_path, one_line_error):
    line = one_line_error(ddpkit("run", "epochs", cwd=tmp_path))
    assert "'epochs' is not a Python script" in line and "ddpkit run train.py --" in line


@pytest.mark.parametrize("backend", ["slurm", "k8s", "docker"])
def test_render_a_script_without_a_job_file(tmp_path, backend):
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").unlink()
    (proj / "my_train.py").write_text(TRAIN_PY)
    nodes = "1" if backend == "docker" else "2"
    r = ddpkit("render", backend, "my_train.py", "--nodes", nodes, "--", "--steps", "3", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "my_train.py" in r.stdout and "runs/my-train" in r.stdout and "--steps" in r.stdout
    assert "ddpkit.train " not in r.stdout  # not the kit's demo trainer


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_every_backend_gives_the_entry_point_the_ckpt_dir(tmp_path, backend):
    proj = make_project(tmp_path / "proj")
    r = ddpkit("render", backend, "--set", "ckpt_dir=runs/user/ckpt", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "DDPKIT_CKPT_DIR" in r.stdout and "runs/user/ckpt" in r.stdout
