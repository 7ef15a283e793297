"""Sweeps as N named jobs (tools/sweep.py): the product of the swept keys, one member per
combination named <name>-<i> with its own run dir; bad sweeps are one line."""

from __future__ import annotations

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.tools import sweep
from ddpkit.tools.jobspec import SpecError, load_spec


def _load(sets: list[str]):
    return load_spec("configs/default.toml", sets, nodes=2)


def test_members_are_the_product_in_order_each_with_its_own_name_and_run_dir():
    specs = sweep.member_specs(_load, ["name=lr"], ["train.lr=1e-3,3e-4", "train.batch_size=32,64"])
    assert [s.name for s in specs] == ["lr-0", "lr-1", "lr-2", "lr-3"]
    assert [(s.train["lr"], s.train["batch_size"]) for s in specs] == [
        (1e-3, 32), (1e-3, 64), (3e-4, 32), (3e-4, 64)]  # fmt: skip
    assert len({s.run_dir for s in specs}) == 4 and specs[0].run_dir == "runs/lr-0"
    docs = [yaml.safe_load(k8s.render(s)) for s in specs]
    assert [d["metadata"]["name"] for d in docs] == ["lr-0", "lr-1", "lr-2", "lr-3"]
    args = docs[3]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert args["args"][args["args"].index("--lr") + 1] == "0.0003"


@pytest.mark.parametrize(
    ("sets", "sweeps", "expect"),
    [
        ([], ["train.lr"], "expected key=v1,v2"),
        ([], ["train.lr=1e-3,,2e-3"], "expected key=v1,v2"),
        ([], ["train.lr=1", "train.lr=2"], "given twice"),
        ([], ["name=a,b"], "members are named <name>-<i>"),
        (["train.run_dir=runs/fixed"], ["train.lr=1e-3,2e-3"], "would share the run_dir"),
        (
            [],
            [
                f"train.seed={','.join(map(str, range(40)))}",
                "train.steps=" + ",".join(map(str, range(1, 30))),
            ],
            "over 1000",
        ),  # fmt: skip
    ],
)
def test_bad_sweeps_are_refused(sets, sweeps, expect):
    with pytest.raises(SpecError, match=expect):
        sweep.member_specs(_load, sets, sweeps)
