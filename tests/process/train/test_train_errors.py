"""Bad input to `python -m ddpkit.train`: one clear line naming the problem and the fix, exit 2."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from tests.trainrun import PY, ROOT, clean_env

CASES = [
    (
        ["--parallel", "fsdp", "--sharding", "HYBRID_SHARD", "--replicate-degree", "3"],
        {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
        r"replicate degree 3 does not divide world size 4 \(4 % 3 = 1\)",
    ),
    (["--sharding", "FULL_SHARD"], {}, r"--sharding FULL_SHARD needs --parallel fsdp"),
    (["--batch-size", "0"], {}, r"--batch-size must be >= 1, got 0"),
    (["--model", "vgg"], {}, r"--model vgg: not a built-in \(mlp, mlp-deep, resnet18, gpt\)"),
    (
        ["--dataset", "imagefolder", "--data-dir", "/nonexistent/x"],
        {},
        r"--data-dir /nonexistent/x does not exist",
    ),
    (["--lr-scaling", "linear"], {}, r"needs --base-batch-size"),
    (["--resume", "/nonexistent/step-3"], {}, r"--resume /nonexistent/step-3: no such checkpoint"),
    (["--config", "/nonexistent.toml"], {}, r"no such file"),
]


@pytest.mark.parametrize("args,env,pattern", CASES)
def test_bad_input_exits_2_with_one_line(args, env, pattern, tmp_path, one_line_error):
    p = subprocess.run(
        [PY, "-m", "ddpkit.train", "--run-dir", str(tmp_path / "r"), *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = one_line_error(p)
    assert line.startswith("error: ") and re.search(pattern, line), line
    assert not (tmp_path / "r").exists()  # nothing written


def test_tokens_file_shorter_than_one_sequence(tmp_path):
    f = tmp_path / "train.bin"
    np.arange(50, dtype=np.uint16).tofile(f)
    p = subprocess.run(
        [
            PY,
            "-m",
            "ddpkit.train",
            "--model",
            "gpt",
            "--dataset",
            "tokens",
            "--data-dir",
            str(f),
            "--seq-len",
            "64",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "has 50 tokens, fewer than one sequence (--seq-len 64 + 1)" in p.stderr
