"""An hf:DIR model whose config.json holds a wrong type is one line naming the file and the key,
exit 2, before anything is written (transformers' own check is a 48-line traceback; older
versions fail in the model's constructor without naming the key)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.trainrun import PY, ROOT, clean_env

pytest.importorskip("transformers")

BAD_TYPES = [  # arch, key, value, what the line says after the key, through the trainer's CLI?
    ("llama", "num_hidden_layers", "abc", "is 'abc' (str), not a positive integer", True),
    ("llama", "hidden_size", [32], "is [32] (list), not a positive integer", False),
    ("llama", "num_attention_heads", 4.5, "is 4.5 (float), not a positive integer", False),
    ("gpt2", "n_layer", "2", "is '2' (str), not a positive integer", False),
    ("gpt2", "vocab_size", "abc", "is 'abc', not a positive integer", True),  # config.py's check
    ("llama", "vocab_size", [64], "is [64], not a positive integer", False),
]
# One case of each check runs `python -m ddpkit.train` as a user would (a process with
# transformers is ~30 s here); the others call the same check in this process.


def _model_dir(tmp_path: Path, arch: str, **keys: object) -> Path:
    from tests.hf_fixtures import make_model_dir

    d = tmp_path / "m"
    make_model_dir(d, 64, arch)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **keys}))
    return d


def _train(model: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [PY, "-m", "ddpkit.train", "--model", f"hf:{model}", "--steps", "1", "--no-eval",
           "--progress", "plain", "--run-dir", str(run_dir)]  # fmt: skip
    env = clean_env(HF_HUB_OFFLINE="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(
    "arch,key,value,said,cli", BAD_TYPES, ids=[f"{a}-{k}" for a, k, *_ in BAD_TYPES]
)
def test_a_wrong_type_in_config_json_names_the_file_and_the_key(
    arch, key, value, said, cli, tmp_path, one_line_error
):
    model = _model_dir(tmp_path, arch, **{key: value})
    if cli:
        line = one_line_error(_train(model, tmp_path / "r"))
        assert not (tmp_path / "r").exists()
    else:
        from ddpkit.train import hf
        from ddpkit.train.config import ConfigError, model_vocab

        with pytest.raises(ConfigError) as e:
            if key == "vocab_size":
                model_vocab(f"hf:{model}")
            else:
                hf.check_config_types(model)
        line = f"error: {e.value}"
    assert line.startswith(f"error: --model hf:{model}: "), line
    assert f"config.json's {key} {said}" in line, line


def test_a_key_only_transformers_checks_is_one_line_too(tmp_path, one_line_error):
    model = _model_dir(tmp_path, "llama", rms_norm_eps="x")
    line = one_line_error(_train(model, tmp_path / "r"))
    assert line.startswith(f"error: --model hf:{model}: {model}/config.json is not a valid "), line
    assert "rms_norm_eps" in line, line


def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, one_line_error):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("[1, 2]")
    line = one_line_error(_train(model, tmp_path / "r"))
    assert f"{model}/config.json holds a JSON list, not an object of config keys" in line, line
