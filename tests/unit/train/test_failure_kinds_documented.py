"""Every failure kind of the vocabulary (train/failure.py KINDS) is in docs/failures.md's table
of kinds, with the retry and node rules the code applies."""

from __future__ import annotations

import re
from pathlib import Path

from ddpkit.train import failure

DOC = Path(__file__).resolve().parents[3] / "docs" / "failures.md"


def test_the_docs_table_lists_every_kind_with_its_rules():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1] in ("yes", "no"):
            rows[re.sub(r" \(.*\)$", "", cells[0])] = (cells[1] == "yes", cells[2] == "yes")
    for kind in failure.KINDS.values():
        assert kind.name in rows, f"{kind.name} is not in {DOC}'s table of kinds"
        assert rows[kind.name] == (kind.retried, kind.node_fault), kind.name
