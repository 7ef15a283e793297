"""The README's install is one block to paste: a venv, torch's CPU build where wanted, the kit
with its extras; and the text beside it says what the install took, as measured."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def install_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str) -> list[list[str]]:
    """The indented code blocks of a Markdown section, each a list of its lines."""
    out: list[list[str]] = []
    last = False
    for line in text.splitlines():
        code = line.startswith("    ") and line.strip()
        if code and last:
            out[-1].append(line.strip())
        elif code:
            out.append([line.strip()])
        last = bool(code)
    return out


def test_the_install_is_one_block_venv_cpu_torch_kit_and_extras():
    first = blocks(install_section())[0]
    assert len(first) == 3, first
    venv, torch, kit = first
    assert venv.startswith("python3 -m venv ") and "bin/activate" in venv
    assert venv.endswith("# Python >= 3.11")
    assert torch.startswith("pip install torch torchvision --index-url ")
    assert "https://download.pytorch.org/whl/cpu" in torch
    assert re.match(r"pip install '/path/to/ddpkit\[[a-z0-9,]+\]'", kit), kit


def test_the_install_says_what_it_took_and_the_wheel_route():
    text = install_section()
    assert re.search(r"took \d+ min \(\d+ s", text) and re.search(r"[\d.]+ GB on disk", text)
    assert "venv on the shared filesystem" in text.replace("\n", " ")
    route = blocks(text)[1]
    assert route[0].startswith("pip wheel --no-deps -w ~/wheels git+file:///path/to/ddpkit")
    assert route[1].startswith('pip install "$HOME/wheels/ddpkit-')
