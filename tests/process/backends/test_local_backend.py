"""The node launcher (train/node.py) and the `local` backend, with real torchrun processes.

- the plain torchrun script (examples/plain_torchrun, knows nothing of ddpkit) runs through
  `python -m ddpkit.tools.submit submit local` on 2 ranks;
- bad input is one line + exit 2 before any process group (launcher and node launcher), and
  a worker's own exit 2 stays 2 without torch's ChildFailedError dump;
- the preemption contract (train/preempt.py) with a real SIGTERM: save + requeue -> 75 and a
  resume; a script that ignores it ends with 143 and one line; a requeue marker left by an
  earlier launch does not turn a crash into 75.

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_local_backend.py. Helpers both use are in
tests/unit/backends/test_local_backend.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ddpkit.train.contract import REQUEUE_MARKER

from tests.trainrun import PY, ROOT, clean_env
from tests.unit.backends.test_local_backend import error_lines, launch


def plain_project(tmp_path: Path) -> Path:
    """The plain example as a user's project of its own (its job file's directory is the
    workspace): a copy in tmp_path, so runs and job records never land in the checkout."""
    import shutil

    proj = tmp_path / "plain-project"
    shutil.copytree(ROOT / "examples" / "plain_torchrun", proj)
    return proj / "job.toml"


def node(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "ddpkit.train.node", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_plain_script_runs_through_submit_local(tmp_path: Path) -> None:
    run = tmp_path / "plain"
    p = launch(
        "submit", "local", "--config", str(plain_project(tmp_path)), "--set", f"train.run_dir={run}",
        "--", "--out", str(run / "result.json"),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["last_loss"] < result["first_loss"] / 100
    assert "world size 2" in (run / "local" / "node-0.log").read_text()
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--", "--lr", "-1"], "error: --lr must be > 0, got -1.0"),
        (["--set", "train.batch_size=0"], "error: --batch-size must be >= 1, got 0; pass a positive integer"),
        (["--", "--no-such-flag"], "error: unrecognized arguments: --no-such-flag (see python -m ddpkit.train --help)"),
        (["--nodes", "2"], "error: local runs one node, got nodes = 2; use --nodes 1, or the slurm or k8s backend for several nodes"),
    ],
)  # fmt: skip
def test_submit_local_bad_input_one_line_exit_2(tmp_path: Path, args, message) -> None:
    run = tmp_path / "r"
    p = launch("submit", "local", "--config", "configs/default.toml",
               "--set", f"train.run_dir={run}", *args)  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert error_lines(p.stderr) == [message]
    assert not run.exists()  # nothing written


def test_node_checks_train_flags_before_torchrun(tmp_path: Path) -> None:
    # HYBRID_SHARD over 2 nodes x 3 processes: the node launcher knows the world size (6).
    p = node("--nnodes=2", "--nproc-per-node=3", "--rdzv-endpoint=127.0.0.1:1", "--",
             "-m", "ddpkit.train", "--run-dir", str(tmp_path / "r"), "--parallel", "fsdp",
             "--sharding", "HYBRID_SHARD", "--replicate-degree", "4")  # fmt: skip
    assert p.returncode == 2, p.stderr
    (line,) = error_lines(p.stderr)
    assert "replicate degree 4 does not divide world size 6" in line
    assert not (tmp_path / "r").exists()


def write_script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(body)
    return path


@pytest.mark.slow
def test_worker_exit_2_is_exit_2_without_a_dump(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "import os, sys\n"
        "if os.environ['RANK'] == '0':\n"
        "    print('error: --thing must be positive', file=sys.stderr)\n"
        "sys.exit(2)\n",
    )
    p = node("--standalone", "--nproc-per-node=2", "--run-dir", str(tmp_path), "--", str(script))
    assert p.returncode == 2
    assert error_lines(p.stderr) == ["error: --thing must be positive"]


@pytest.mark.slow
def test_stale_requeue_marker_does_not_fake_a_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # An earlier attempt saved and asked for a requeue; this one crashes before training.
    (run / REQUEUE_MARKER).write_text(json.dumps({"launch_id": "old-attempt", "time": 1e10}))
    script = write_script(tmp_path, "raise SystemExit(1)\n")
    p = node("--standalone", "--nproc-per-node=2", "--run-dir", str(run), "--", str(script))
    assert p.returncode == 1, p.stderr
    # whichever rank torchrun saw fail first
    assert re.fullmatch(
        r"ddpkit node: rank [01] \(node 0, host \S+\) failed \(exit code 1\); see its output above",
        error_lines(p.stderr)[-1],
    ), p.stderr


def start_preemptible(run: Path, steps: int) -> subprocess.Popen[str]:
    job = plain_project(run.parent)
    proc = subprocess.Popen(
        [PY, "-m", "ddpkit.tools.submit", "submit", "local", "--config", str(job),
         "--set", "script=preemptible.py", "--set", f"train.run_dir={run}",
         "--set", "train.shutdown_timeout_s=20",
         "--", "--steps", str(steps), "--step-s", "0.05", "--out", str(run / "result.json")],
        cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until rank 0 trains
        if "started at step" in line:
            return proc
    proc.wait(timeout=60)
    raise AssertionError(f"did not start: {proc.stderr.read() if proc.stderr else ''}")


@pytest.mark.slow
def test_preempt_helper_requeue_then_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_preemptible(run, steps=2000)
    time.sleep(1.0)  # let it take some steps (0.05 s each), so the resume is visible
    proc.send_signal(signal.SIGTERM)  # what `cancel local`, docker stop and k8s send
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out + err
    marker = json.loads((run / REQUEUE_MARKER).read_text())
    assert marker["signal"] == "SIGTERM" and marker["step"] > 0 and marker["launch_id"]
    # submit local puts the job's stdout and stderr into one stream (and its log file)
    assert "ddpkit node: a checkpoint was saved on a stop signal; exit 75 (requeue)" in out
    assert "Traceback" not in out + err
    # Run again: it resumes from its checkpoint and finishes.
    again = subprocess.run(
        [PY, "-m", "ddpkit.tools.submit", "submit", "local", "--config",
         str(run.parent / "plain-project" / "job.toml"),
         "--set", "script=preemptible.py", "--set", f"train.run_dir={run}",
         "--", "--steps", str(marker["step"] + 5), "--out", str(run / "result.json")],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "result.json").read_text())["start"] == marker["step"]


@pytest.mark.slow
def test_script_that_ignores_the_signal_ends_cleanly(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "import time\nprint('started', flush=True)\ntime.sleep(120)\n",
    )
    proc = subprocess.Popen(
        [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node=2", "--run-dir",
         str(tmp_path), "--", str(script)],
        cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "started" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert error_lines(err) == [
        "ddpkit node: stopped by SIGTERM without a requeue request (exit 143); "
        "see docs/running.md 'Preemption in your own script' to ask for a requeue"
    ]


@pytest.mark.slow
def test_a_cancel_that_reaches_one_rank_of_a_users_script_saves_and_asks_for_no_requeue(
    tmp_path: Path,
) -> None:
    """The example script under the node launcher with SLURM's requeue signal (USR1), and a
    SIGTERM that reached rank 1 only (the other node's slurmd had not signalled yet): both
    ranks stop at the same step and save, and rank 0, which got no signal, asks for no
    requeue (a bare flag made it write a marker, and the launch exited 75: a requeue)."""
    from ddpkit.tools import chaos

    run = tmp_path / "run"
    proj = plain_project(tmp_path).parent
    (run / "out").mkdir(parents=True)
    proc = subprocess.Popen(
        [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node=2", "--run-dir",
         str(run), "--", str(proj / "preemptible.py"), "--steps", "100000", "--step-s", "0.05",
         "--out", str(run / "out" / "result.json")],
        cwd=tmp_path, env=clean_env(DDPKIT_REQUEUE_SIGNALS="SIGUSR1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # rank 0 trains
            if "started at step" in line:
                break
        [rank1] = [w for w in chaos.workers(run) if w.rank == 1]
        os.kill(rank1.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stops = re.findall(r"rank (\d): stop at step (\d+)", out)
    assert sorted(r for r, _ in stops) == ["0", "1"] and len({s for _, s in stops}) == 1, out + err
    assert (run / "checkpoints" / "ckpt.pt").is_file()  # $DDPKIT_CKPT_DIR
    assert not (run / REQUEUE_MARKER).exists(), (run / REQUEUE_MARKER).read_text()
    assert proc.returncode != 75 and "Traceback" not in err, (proc.returncode, err)


@pytest.mark.slow
def test_a_signal_in_the_last_steps_ends_in_a_finished_run_exit_0(tmp_path: Path) -> None:
    """SIGTERM to the launcher just before the last step: the trainer finishes (too late to
    stop), so the launch is a finished run (exit 0, one line), not a death by signal."""
    run = tmp_path / "run"
    env = clean_env(DDPKIT_FAULT="signal@12:0:SIGTERM")  # rank 0 signals its agent
    p = subprocess.run(
        [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node=2", "--run-dir", str(run),
         "--", "-m", "ddpkit.train", "--run-dir", str(run), "--steps", "12", "--progress", "plain",
         "--no-eval", "--synthetic-samples", "1024", "--batch-size", "16"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert error_lines(p.stderr)[-1] == (
        "ddpkit node: SIGTERM arrived during the last steps; the run finished (nothing to requeue)"
    )
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["signal"]) == (12, "SIGTERM")
    assert not (run / REQUEUE_MARKER).exists()


@pytest.mark.slow
def test_each_local_job_has_its_own_log_and_logs_shows_the_last(tmp_path: Path) -> None:
    """Two runs of one project: `ddpkit logs local` prints the second run's output only,
    <run dir>/local/node-0.log is that log, and the first run's is kept in a log of its own
    (the log used to be appended to across runs, with no separator)."""
    import sys

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hello.py").write_text("import sys\nprint('token', sys.argv[1], flush=True)\n")
    (proj / "ddpkit.toml").write_text(
        'name = "hello"\nscript = "hello.py"\nnproc_per_node = 1\naccelerator = "cpu"\n'
    )
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ddpkit, *args], cwd=proj, env=clean_env(), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    for token in ("first-run", "second-run"):
        assert (p := run("run", "--", token)).returncode == 0, p.stdout + p.stderr
    shown = run("logs", "local")
    assert shown.returncode == 0, shown.stderr
    assert "token second-run" in shown.stdout and "first-run" not in shown.stdout, shown.stdout
    local = proj / "runs" / "hello" / "local"
    assert (local / "node-0.log").read_text() == shown.stdout
    logs = sorted(p for p in local.glob("node-0.*.log"))
    assert len(logs) == 2, logs
    assert sum("token first-run" in p.read_text() for p in logs) == 1


# Quotes, $(), backticks, a backslash, a newline, non-ASCII, YAML's line breaks, a byte that
# is not UTF-8 (an argument read with surrogateescape) and a leading dash (argparse's flag).
HOSTILE = (
    "-lead 'q' \"d\" $(touch PWNED) `touch PWNED` back\\slash\\n\nnext é \x85\u2028 \udcff end"
)


@pytest.mark.parametrize("value", [HOSTILE, "-raw\\data\x85$(x)"], ids=["hostile", "dash"])
def test_a_data_dir_and_an_env_value_reach_the_trainer_byte_for_byte(tmp_path, value) -> None:
    """The rendered local script, run by bash: the environment value and the trainer's
    --data-dir arrive as given (the trainer's own parser reads the value back), and nothing
    in them runs."""
    from ddpkit.train.config import parse_config

    r = subprocess.run(
        [PY, "-m", "ddpkit.tools.submit", "render", "local", "--set", f"train.data_dir={value}",
         "--set", f"env.X={value}", "--set", f"train.run_dir={tmp_path / 'r'}"],
        cwd=ROOT, env=clean_env(), capture_output=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (tmp_path / "job.sh").write_bytes(r.stdout)
    record = tmp_path / "argv"
    # `exec` as a function: the script's last line hands this its argv instead of the launcher
    prelude = f'exec() {{ printf \'%s\\0\' "$X" "$@" > {record}; }}; source ./job.sh'
    subprocess.run(["bash", "-c", prelude], cwd=tmp_path, check=True, timeout=60)
    x, *argv = [os.fsdecode(w) for w in record.read_bytes().split(b"\0")[:-1]]
    assert x == value
    entry = argv[argv.index("--") + 1 :]
    assert entry[:2] == ["-m", "ddpkit.train"]
    cfg, _ = parse_config(entry[2:], world=(1, 1), installed=False, local_paths=False)
    assert cfg.data_dir == value
    assert not (tmp_path / "PWNED").exists()


def test_gpus_beyond_the_visible_ones_are_refused_and_none_is_said(tmp_path, monkeypatch, capsys):
    """`--gpus 4` (make train GPUS=4) on 2 visible GPUs: one line, exit 2, nothing runs; on a
    machine without GPUs the CPU fallback is said, not silent."""
    from ddpkit.tools.backends import local
    from ddpkit.tools.jobspec import load_spec

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}
    ddpkit = str(Path(PY).with_name("ddpkit"))
    r = subprocess.run([ddpkit, "submit", "local", "--gpus", "4"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "4 processes on 2 visible GPU(s)" in r.stderr and not (tmp_path / "runs").exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    local.check_gpus(load_spec(None, None, gpus=3))
    assert "no GPU visible; 3 CPU process(es) with gloo" in capsys.readouterr().err


def test_a_data_dir_argparse_cannot_carry_is_refused_in_one_line_at_render() -> None:
    """argparse drops a value that is exactly `--`: refused, never trained with data_dir=[]."""
    p = launch("render", "local", "--set", "train.data_dir=--")
    assert p.returncode == 2 and error_lines(p.stderr) == [
        "error: --data-dir '--' cannot reach the trainer as a value; use ./--"
    ], p.stderr
