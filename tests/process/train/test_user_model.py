"""Your own model, data and loss through import paths and the public API.

The example package examples/mypkg trains under DDP and FSDP2 with real torchrun ranks and
resumes bitwise identically after a SIGKILL; bad import paths and factories that return the
wrong thing exit 2 with one line before any process group starts.
"""

from __future__ import annotations

import re
import subprocess
import textwrap

import pytest

from tests.trainrun import PY, ROOT, clean_env, last_checkpoint, train

EXAMPLES = str(ROOT / "examples")
JOB = str(ROOT / "examples" / "mypkg_job.toml")

BAD_PKG = """
import torch
not_callable = 3
def returns_int(cfg):
    return 7
def model(cfg, width=8):
    return torch.nn.Linear(16, width)
def data_list(cfg):
    return [1, 2, 3]
def data_not_pairs(cfg):
    return [1, 2, 3], None
def frozen(cfg):
    m = torch.nn.Linear(784, 10)
    for p in m.parameters():
        p.requires_grad_(False)
    return m
def vec_loss(out, y):
    return torch.nn.functional.cross_entropy(out, y, reduction="none")
def float_loss(out, y):
    return 1.0
"""

BAD_CASES = [
    (
        ["--model", "nosuch.mod:build"],
        r"^error: --model nosuch\.mod:build: cannot import nosuch\.mod \(ModuleNotFoundError: "
        r"No module named 'nosuch'\); put its package on PYTHONPATH",
    ),
    (
        ["--model", "badpkg:missing"],
        r"^error: --model badpkg:missing: module badpkg has no attribute missing; expected a "
        r"factory \(cfg, \*\*model_args\) -> torch\.nn\.Module$",
    ),
    (
        ["--model", "badpkg:not_callable"],
        r"^error: --model badpkg:not_callable: not_callable is a int, not callable",
    ),
    (
        ["--model", "badpkg:returns_int"],
        r"^error: --model badpkg:returns_int returned a int; expected a factory",
    ),
    (
        ["--model", "badpkg:model", "--model-args", '{"depth": 2}'],
        r"^error: --model badpkg:model: calling it with --model-args \{'depth': 2\} raised "
        r"TypeError: .*unexpected keyword argument 'depth'",
    ),
    (
        ["--model", "badpkg:model", "--model-args", "[1]"],
        r"^error: argument --model-args: '\[1\]' is not a JSON object",
    ),
    (["--model", "no path"], r"^error: --model no path: not a built-in \(mlp, mlp-deep"),
    (
        ["--model", "badpkg:frozen"],
        r"^error: --model badpkg:frozen returned a Linear without a parameter that requires grad",
    ),
    (["--loss", "badpkg:nothing"], r"^error: --loss badpkg:nothing: module badpkg has no attr"),
    (
        ["--dataset", "badpkg:data_list"],
        r"^error: --dataset badpkg:data_list returned a list; expected a function \(cfg, "
        r"\*\*dataset_args\) -> \(train, val\) or \(train, val, info\)$",
    ),
    (
        ["--dataset", "badpkg:data_not_pairs"],
        r"^error: --dataset badpkg:data_not_pairs returned items of type int \(train\[0\]\); "
        r"items must be \(x, y\) pairs",
    ),
]


@pytest.mark.parametrize("args,pattern", BAD_CASES, ids=[c[0][1] for c in BAD_CASES])
def test_bad_paths_and_factories_exit_2_with_one_line(args, pattern, tmp_path):
    (tmp_path / "badpkg.py").write_text(BAD_PKG)
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [PY, "-m", "ddpkit.train", "--run-dir", str(run_dir), "--steps", "2", *args],
        cwd=ROOT,
        env=clean_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and re.search(pattern, lines[0]), p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert not run_dir.exists()  # nothing written


@pytest.mark.parametrize(
    "loss, got",
    [("vec_loss", "a float32 tensor of shape [64]"), ("float_loss", "a float")],
)
def test_a_loss_that_breaks_its_contract_is_one_line_at_the_first_step(loss, got, tmp_path):
    (tmp_path / "badpkg.py").write_text(BAD_PKG)
    p = subprocess.run(
        [PY, "-m", "ddpkit.train", "--run-dir", str(tmp_path / "run"), "--steps", "2",
         "--loss", f"badpkg:{loss}"],
        cwd=ROOT, env=clean_env(PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr, p.stderr
    assert p.stderr.strip() == (
        f"error: --loss badpkg:{loss} returned {got}; expected a function (output, target) "
        "-> scalar tensor"
    )
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").glob("step-*")
    )  # nothing saved from a step that never trained


def test_the_package_through_its_job_file_learns_with_its_own_loss(tmp_path):
    run = train(tmp_path / "r", "--config", JOB, "--steps", "20", env={"PYTHONPATH": EXAMPLES})
    s = run.summary
    assert s["model"] == "mypkg.models:build_model"
    # ResMLP(16 -> 64, 3 ResBlocks of 64 -> 128 -> 64 with LayerNorm, 64 -> 4)
    assert s["num_params"] == 16 * 64 + 64 + 3 * (2 * 64 + 64 * 128 + 128 + 128 * 64 + 64) + 260
    assert s["final_loss"] < 0.6 * s["first_loss"]
    assert "eval_loss" in s and "eval_accuracy" not in s  # the user's loss: no accuracy


BASE = (
    "--config",
    JOB,
    "--stop-check-s",
    "0",
    "--steps",
    "12",
    "--batch-size",
    "16",
    "--log-interval",
    "3",
    "--ckpt-interval",
    "3",
    "--no-eval",
)


@pytest.mark.slow
def test_sigkill_resume_is_bitwise_identical(tmp_path):
    """The package's model under DDP. Under FSDP FULL_SHARD a user's model resumes bitwise after
    the same kill in tests/process/launch/test_user_project.py (by import path, through the installed
    command), and four ranks resume bitwise in tests/process/train/ckpt/test_fault_tolerance.py."""
    env = {"PYTHONPATH": EXAMPLES}
    ref = train(tmp_path / "ref", *BASE, "--parallel", "ddp", nproc=2, env=env)
    run = train(
        tmp_path / "run",
        *BASE,
        "--parallel",
        "ddp",
        nproc=2,
        torchrun_args=("--max-restarts", "1"),
        env={**env, "DDPKIT_FAULT": "kill@8:1"},
    )  # rank 1 SIGKILLs itself before step 8; torchrun restarts the group from step-6
    assert "[fault injection] kill on rank 1 at step 8" in run.out
    assert run.summary["resumed_from"].endswith("step-6")
    assert run.summary["world_size"] == 2
    assert ref.summary["final_loss"] < ref.summary["first_loss"]
    assert run.summary["param_digest"] == ref.summary["param_digest"]
    assert last_checkpoint(run.run_dir).name == "step-12"


@pytest.mark.slow
@pytest.mark.parametrize("nproc,parallel", [(2, "fsdp"), (4, "ddp")])
def test_the_package_trains_on_more_world_sizes(nproc, parallel, tmp_path):
    run = train(
        tmp_path / "r", *BASE, "--parallel", parallel, nproc=nproc, env={"PYTHONPATH": EXAMPLES}
    )
    assert run.summary["steps"] == 12 and run.summary["world_size"] == nproc
    assert run.summary["final_loss"] < run.summary["first_loss"]


def test_the_public_api_script_runs_with_flags_over_its_keywords(tmp_path):
    script = ROOT / "examples" / "fit_script.py"
    assert len(script.read_text().splitlines()) <= 30
    run_dir = tmp_path / "r"
    p = subprocess.run(
        [PY, str(script), "--steps", "8", "--run-dir", str(run_dir), "--progress", "plain"],
        cwd=tmp_path,  # not the checkout: the script finds ddpkit itself
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    import json

    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steps"] == 8  # the flag won over fit(steps=100)
    assert s["model"] == "__main__:build_model"
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["batch_size"] == 32 and cfg["lr"] == 3e-3  # fit()'s keywords


def test_fit_is_import_light_and_rejects_unknown_settings(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        import train
        assert "torch" not in sys.modules, "import train loaded torch"
        sys.exit(train.fit(stepz=3, argv=[]))
        """
    )
    p = subprocess.run(
        [PY, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: fit(): unknown setting 'stepz'"), p.stderr


def test_a_job_file_carries_model_args_to_the_nodes_as_json():
    from ddpkit.tools.jobspec import load_spec
    from ddpkit.train.config import parse_config

    spec = load_spec(JOB)
    argv = spec.train_argv()
    i = argv.index("--model-args")
    assert argv[i + 1] == '{"width":64,"depth":3}'  # JSON, not a Python repr
    cfg, _ = parse_config(argv)
    assert cfg.model_args == {"width": 64, "depth": 3}
    assert cfg.dataset_args == {"samples": 2048}


STATE_SCRIPT = """
import sys
import torch
sys.path.insert(0, sys.argv.pop(1))
from ddpkit.train import fit

class Counter:  # the user's own state: forward passes seen
    def __init__(self):
        self.n = 0
    def state_dict(self):
        return {"n": torch.tensor(self.n)}
    def load_state_dict(self, state):
        self.n = int(state["n"])

counter = Counter()

class Net(torch.nn.Linear):
    def forward(self, x):
        counter.n += 1
        return super().forward(x)

def data(cfg):
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), None

raise SystemExit(fit(lambda cfg: Net(4, 2), data, states={"counter": counter}, batch_size=8))
"""


def test_a_user_state_object_is_checkpointed_and_restored(tmp_path):
    from tests.trainrun import full_params

    script = tmp_path / "s.py"
    script.write_text(STATE_SCRIPT)
    run_dir = tmp_path / "r"

    def run(steps: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PY, str(script), str(ROOT), "--steps", str(steps), "--run-dir", str(run_dir)]
            + ["--no-eval", "--progress", "plain"],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run(4).returncode == 0
    assert run(7).returncode == 0  # resumes from step-4: the counter continues from 4
    assert int(full_params(run_dir / "checkpoints" / "step-4", "user_counter")["n"]) == 4
    assert int(full_params(run_dir / "checkpoints" / "step-7", "user_counter")["n"]) == 7
