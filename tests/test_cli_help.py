"""What a user sees from --help and from a tool whose output is cut short (`| head -1`)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from train.config import TrainConfig, build_parser, field_help

ROOT = Path(__file__).resolve().parents[1]


def _help_entries() -> dict[str, str]:
    """flag -> its help text, from the real `python -m train --help` output."""
    out = subprocess.run(
        [sys.executable, "-m", "train", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    entries = {}
    options = out.stdout.split("\noptions:\n", 1)[1]
    for block in re.split(r"\n(?=  -)", options):
        # "  --flag[, --no-flag] [METAVAR]" then the text, on the same line or wrapped below
        m = re.match(r"\s*(-[-\w]+)(?:, --no-[\w-]+)?(?: \S+)?(?:\s{2,}|\n)(.*)", block, re.S)
        if m:
            entries[m.group(1)] = " ".join(m.group(2).split())
    return entries


def test_every_flag_has_its_meaning_and_default_once():
    entries = _help_entries()
    cfg_fields = [f for f in fields(TrainConfig) if f.metadata.get("cli") is not False]
    for f in cfg_fields:
        flag = "--" + f.name.replace("_", "-")
        assert flag in entries, f"{flag} missing from --help"
        text = entries[flag]
        assert field_help()[f.name], f"TrainConfig.{f.name} has no trailing comment"
        assert text.startswith(field_help()[f.name]), (flag, text)
        assert text.count("(default:") <= 1, (flag, text)
        assert "(default: None)" not in text and "(default: )" not in text, (flag, text)
    assert entries["--batch-size"] == "per rank, per micro-step (default: 64)"
    assert entries["--lr"].endswith("(default: 0.001)")
    assert "(default:" not in entries["--steps"]  # None: the comment says what happens


def test_booleans_show_both_spellings():
    actions = {a.dest: a for a in build_parser()._actions}
    for f in fields(TrainConfig):
        if f.type in ("bool", bool):
            flag = "--" + f.name.replace("_", "-")
            assert actions[f.name].option_strings == [flag, "--no-" + flag[2:]]
    entries = _help_entries()
    assert entries["--eval"].endswith("(default: on)")
    assert entries["--ckpt-async"].endswith("(default: off)")


def test_a_flag_not_given_does_not_override_the_file(tmp_path):
    from train.config import parse_config

    f = tmp_path / "c.toml"
    f.write_text("batch_size = 7\n")
    cfg, _ = parse_config(["--config", str(f), "--run-dir", str(tmp_path / "r")])
    assert cfg.batch_size == 7
