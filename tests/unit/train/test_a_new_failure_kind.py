"""A new failure kind touches one room (issue 52): its entry and its rule in train/failure.py
(here registered from the test, as a plugin would), and every reader names it: a worker's
failure as the launcher sees it, the goodput report from the run's records, the retry and
exclusion rules, the drills' list."""

from __future__ import annotations

import pytest
from ddpkit.train import failure, goodput


@pytest.fixture
def ecc(monkeypatch):
    """An "ecc error" kind: a worker whose error says the GPU's memory had an uncorrectable
    ECC error (a restart elsewhere may cure it; the node's fault), caused by a drill of its own."""
    monkeypatch.setattr(failure, "KINDS", dict(failure.KINDS))
    monkeypatch.setattr(failure, "RULES", dict(failure.RULES))
    kind = failure.Kind("ecc error", True, True, ("ecc-node",), (), "an uncorrectable ECC error")
    failure.register(kind, lambda code, facts: "ecc" in str(facts.get("error", "")).lower(),
                     before=failure.CODE_ERROR.name)  # fmt: skip
    return kind


ERROR = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_the_launcher_names_the_new_kind(ecc):
    facts = {"cause": failure.INFRA, "error": ERROR}
    assert failure.Failure.from_facts(1, 5.0, facts, exact=True).kind == "ecc error"
    assert failure.kind_of(1, {"cause": failure.INFRA, "error": "Connection reset"}) == "crashed"
    assert failure.kind("ecc error").retried and failure.counts_against_node("ecc error")
    assert "ecc-node" in failure.drill_kinds() and failure.drilled("ecc-node") is ecc


def test_the_goodput_report_names_it_and_counts_it_against_its_node(ecc, tmp_path):
    for attempt, t in ((0, 100.0), (1, 200.0)):
        goodput.record(tmp_path, "attempt", time=t, attempt=attempt, node="gpu7", ranks=[0, 2])
        goodput.record(tmp_path, "ready", time=t + 1, attempt=attempt, node="gpu7", load_s=0.1)
    goodput.record(tmp_path, "end", time=150.0, attempt=0, node="gpu7", rank=1, code=1,
                   cause=failure.INFRA, error=ERROR)  # fmt: skip
    goodput.record(tmp_path, "end", time=250.0, attempt=1, node="gpu7", rank=1, code=1,
                   cause=failure.INFRA, error=ERROR)  # fmt: skip
    rep = goodput.report(tmp_path, ended=True)
    assert [f.kind for f in rep.failures] == ["ecc error", "ecc error"]
    assert rep.failing_nodes() == ["gpu7"]  # two of them: left out of the next attempt
    assert any("failure: ecc error" in line for line in goodput.status_lines(tmp_path))
