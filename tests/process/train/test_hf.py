"""Hugging Face models and data in the kit's trainer, offline: a tiny
LlamaConfig and a word-level tokenizer built locally (tests/hf_fixtures.py), real torchrun
ranks with gloo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.hf_fixtures import make_all, make_model_dir
from tests.trainrun import PY, ROOT, as_a_process, clean_env, full_params, last_checkpoint, train

pytestmark = pytest.mark.slow

SEQ, BATCH = 32, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    model, data = make_all(root)
    env = {"HF_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return model, data, env


def hf_args(model: Path, data: Path, *extra: str) -> tuple[str, ...]:
    return (
        "--model",
        f"hf:{model}",
        "--dataset",
        f"hf:{data}",
        "--seq-len",
        str(SEQ),
        "--batch-size",
        str(BATCH),
        "--lr",
        "3e-3",
        "--log-interval",
        "2",
        "--stop-check-s",
        "0",
        "--no-eval",
        *extra,
    )


@pytest.fixture(scope="module")
def ddp_and_fsdp(tiny, tmp_path_factory):
    model, data, env = tiny
    root = tmp_path_factory.mktemp("runs")
    args = hf_args(model, data, "--steps", "8")
    ddp = train(root / "ddp", *args, nproc=2, env=env)
    trace = root / "fsdp-trace"  # the samples it trained on: the exactly-once test reads them
    trace.mkdir()
    fsdp = train(
        root / "fsdp",
        *args,
        "--parallel",
        "fsdp",
        "--sharding",
        "FULL_SHARD",
        nproc=2,
        env={**env, "DDPKIT_TRACE_SAMPLES": str(trace)},
    )
    return ddp, fsdp


def test_full_shard_equals_ddp_on_the_tiny_hf_model(ddp_and_fsdp):
    ddp, fsdp = ddp_and_fsdp
    assert ddp.summary["final_loss"] < ddp.summary["first_loss"]
    assert ddp.summary["tokens_per_s"] > 0
    a, b = full_params(last_checkpoint(ddp.run_dir)), full_params(last_checkpoint(fsdp.run_dir))
    assert a.keys() == b.keys() and any(k.startswith("hf.model.layers.1.") for k in a)
    # Tolerance: after 8 AdamW steps the fp32 weights agree to 1e-5 (same data, same init;
    # only the reduction order of the gradient collectives differs).
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-5, worst
    assert abs(ddp.summary["final_loss"] - fsdp.summary["final_loss"]) <= 1e-4


def test_hf_export_reloads_with_from_pretrained_and_equal_logits(tiny, ddp_and_fsdp, tmp_path):
    from ddpkit.train import hf
    from ddpkit.train.config import TrainConfig
    from transformers import AutoModelForCausalLM

    model_dir, data, env = tiny
    ckpt = last_checkpoint(ddp_and_fsdp[1].run_dir)  # the FULL_SHARD run's sharded checkpoint
    out = tmp_path / "export"
    p = subprocess.run(
        [
            PY,
            "-m",
            "ddpkit.tools.ckpt",
            "export",
            str(ckpt.parent.parent),
            str(out),
            "--format",
            "hf",
        ],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {out}:") and p.stderr == ""
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    # The trained model: the kit's own wrapper with the checkpoint's weights.
    trained = hf.build(model_dir, TrainConfig(seq_len=SEQ, dataset=f"hf:{data}")).eval()
    trained.load_state_dict(full_params(ckpt))
    x = torch.randint(
        0, loaded.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want, got = trained(x), loaded(input_ids=x).logits
    # Tolerance: exact. The same fp32 weights go through the same modules.
    assert torch.equal(want, got), (want - got).abs().max()


def _epoch0_samples(trace: Path) -> list[int]:
    seen = []
    for f in sorted(trace.glob("rank*.txt")):
        for line in f.read_text().splitlines():
            ep, *idx = map(int, line.split())
            if ep == 0:
                seen += idx
    return seen


def test_hf_text_data_exactly_once_across_a_world_size_change(tiny, ddp_and_fsdp, tmp_path):
    """The FULL_SHARD fixture run (2 ranks, 8 steps) resumed by one process for the rest of
    epoch 0: every sequence trained once. (It was a 4-rank run resumed on 2: the same
    resharded data position, for 5 fewer worker processes.)"""
    from ddpkit.train import hf
    from ddpkit.train.config import TrainConfig

    model, data, env = tiny
    n = len(
        hf.build_dataset(
            TrainConfig(model=f"hf:{model}", dataset=f"hf:{data}", seq_len=SEQ), data
        ).train
    )
    a = ddp_and_fsdp[1]
    done = 8 * 2 * BATCH
    steps_b = (n - done) // BATCH  # the rest of epoch 0 on 1 rank (the tail is dropped)
    trace_b = tmp_path / "tb"
    trace_b.mkdir()
    b = train(
        tmp_path / "b",
        *hf_args(
            model, data, "--steps", str(8 + steps_b), "--resume", str(last_checkpoint(a.run_dir))
        ),
        env={**env, "DDPKIT_TRACE_SAMPLES": str(trace_b)},
    )
    assert "world size 2 -> 1" in b.out
    seen = _epoch0_samples(a.run_dir.parent / "fsdp-trace") + _epoch0_samples(trace_b)
    assert len(seen) == len(set(seen)) == done + steps_b * BATCH
    assert set(seen) <= set(range(n)) and n - len(seen) < BATCH


def test_bad_hf_paths_exit_2_with_one_line(tiny, tmp_path, monkeypatch, capfd):
    """Each bad hf: path is exit 2, one line, no run dir. The last case (the tokenizer's, the
    most imports) runs `python -m ddpkit.train` as a process; the others run its main() in
    this process, as the process runs it (a process per case imports torch again; a warning
    that a process would print counts as a second line). `ddpkit ckpt export --format hf` of
    a missing step dir runs in this process too (its process's exit 2 and one line:
    tests/process/launch/test_bad_input.py's export tests)."""
    from ddpkit.tools import ckpt
    from ddpkit.train import __main__ as entry

    model, data, env = tiny
    (tmp_path / "empty").mkdir()
    cases = [
        (["--model", f"hf:{tmp_path / 'empty'}"], "no config.json in"),
        (
            ["--model", f"hf:{model}", "--seq-len", "32", "--dataset", f"hf:{tmp_path / 'empty'}"],
            "no .txt/.jsonl",
        ),
        (["--model", f"hf:{model}", "--seq-len", "100"], "exceeds hf:"),
        (
            ["--model", f"hf:{model}", "--dataset", "mnist"],
            "holds classes; pick a dataset of tokens",
        ),
        (
            ["--model", "gpt", "--vocab-size", "10", "--dataset", f"hf:{data}"]
            + ["--dataset-args", json.dumps({"tokenizer": str(model)})],
            "more than --vocab-size 10; pass --vocab-size 25 or more",
        ),
    ]
    rd = tmp_path / "r"
    *here, (last_args, last_text) = cases
    # the process's environment (clean_env(**env)), its directory, no signal handlers
    for k, v in clean_env(**env).items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "DDPKIT_FAULT", "TORCHELASTIC_RUN_ID"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(entry.signals, "install", lambda: None)
    monkeypatch.setattr(entry.teardown, "install", lambda: None)
    for args, text in here:
        rc, _, err = as_a_process(capfd, lambda a=args: entry.main(["--run-dir", str(rd), *a]))
        lines = [x for x in err.splitlines() if x.strip()]
        assert rc == 2 and len(lines) == 1 and text in lines[0], (args, err)
        assert not rd.exists()
    p = subprocess.run(
        [PY, "-m", "ddpkit.train", "--run-dir", str(rd), *last_args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and last_text in lines[0], (last_args, p.stderr)
    assert not rd.exists()
    capfd.readouterr()
    rc = ckpt.main(["export", str(tmp_path / "nope"), str(tmp_path / "o"), "--format", "hf"])
    assert rc == 2 and "no such directory" in capfd.readouterr().err


def test_the_vocabulary_comes_from_the_models_config_json(tmp_path):
    """A 256-token HF model trains on synthetic tokens without --vocab-size (the default
    512 used to refuse it); an explicit --vocab-size still wins, and a wrong type in
    config.json is one line."""
    from ddpkit.train.config import ConfigError, parse_config

    model = tmp_path / "m"
    make_model_dir(model, 256)
    cfg, _ = parse_config(["--model", f"hf:{model}"], installed=False)
    assert cfg.vocab_size == 256
    cfg, _ = parse_config(["--model", f"hf:{model}", "--vocab-size", "100"], installed=False)
    assert cfg.vocab_size == 100
    cfg, _ = parse_config(["--model", "gpt"], installed=False)
    assert cfg.vocab_size == 512
    bad = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**bad, "vocab_size": "256"}))
    with pytest.raises(ConfigError, match="config.json's vocab_size is '256'"):
        parse_config(["--model", f"hf:{model}"], installed=False)
