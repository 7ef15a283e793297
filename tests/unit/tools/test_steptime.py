"""The step-time model (ddpkit memory --step-time): ring costs, volumes per strategy against
the hand-derived formulas, the overlap rule, the fit of commbench data, the recommendation,
bad input, and one real 2-rank step against its prediction.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_steptime.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from ddpkit.tools.commbench import bus_factor
from ddpkit.tools.planner import cli as memory
from ddpkit.tools.planner import links as steptime_links
from ddpkit.tools.planner import recommend as steptime_plan
from ddpkit.tools.planner.links import Fabric, Link
from ddpkit.tools.planner.model import PlanError
from ddpkit.tools.planner.predict import STRATEGIES, Compute, ModelComm, Prediction, predict

from tests.badjson import cases, damaged
from tests.trainrun import PY, ROOT

OPS = steptime_links.OPS


def link(bw: float = 100e9, hop: float = 1e-5, base: float = 0.0) -> Link:
    return Link("test", {op: bw for op in OPS}, {op: hop for op in OPS}, base)


def no_compute(samples: int = 1) -> Compute:
    return Compute(0.0, 0.0, 0.0, samples, "none")


def test_ring_cost_factors_and_steps():
    lk = link(bw=1e9, hop=2e-6, base=5e-6)
    n, s = 8, 1e9
    assert lk.time("all_reduce", s, n) == pytest.approx(5e-6 + 14 * 2e-6 + 2 * 7 / 8)
    assert lk.time("all_gather", s, n) == pytest.approx(5e-6 + 7 * 2e-6 + 7 / 8)
    assert lk.time("reduce_scatter", s, n) == pytest.approx(5e-6 + 7 * 2e-6 + 7 / 8)
    assert lk.time("all_reduce", s, 1) == 0.0  # one rank: nothing to send


def test_volumes_per_strategy_match_the_hand_formulas():
    P, root, blocks = 1_000_000, 200_000, [100_000] * 8
    m = ModelComm(P, root, blocks, param_bytes=2)
    N, G = 4, 8
    W = N * G
    fab = Fabric(link(), link(), N, G)
    vol = {s: predict(s, m, fab, no_compute()).volume_bytes for s in STRATEGIES}
    ag = (W - 1) / W
    assert vol["DDP"] == pytest.approx(2 * ag * 4 * P)  # all_reduce of fp32 grads
    # all_gather fwd (every unit) + bwd (the blocks: the root stays gathered) + reduce_scatter
    assert vol["FULL_SHARD"] == pytest.approx(ag * (2 * P + 2 * (P - root) + 4 * P))
    assert vol["SHARD_GRAD_OP"] == pytest.approx(ag * (2 * P + 4 * P))
    g = (G - 1) / G  # HYBRID_SHARD: FSDP in the node, all_reduce of the shard across nodes
    assert vol["HYBRID_SHARD"] == pytest.approx(
        g * (2 * P + 2 * (P - root) + 4 * P) + 2 * (N - 1) / N * 4 * P / G
    )


def test_the_articles_2_psi_against_3_psi():
    """The article's table: DDP moves 2 Psi, FSDP 3 Psi (fp32, no root unit)."""
    m = ModelComm(1_000_000, 0, [125_000] * 8)
    fab = Fabric(link(), link(), 1, 8)
    ddp = predict("DDP", m, fab, no_compute()).volume_bytes
    full = predict("FULL_SHARD", m, fab, no_compute()).volume_bytes
    assert full / ddp == pytest.approx(1.5)


def test_ddp_time_is_its_buckets_and_the_last_one_is_exposed():
    m = ModelComm(10_000_000, 0, [10_000_000])  # 40 MB of grads: buckets of 25 MiB + rest
    lk = link(bw=10e9, hop=1e-5)
    fab = Fabric(lk, lk, 1, 4)
    sizes = [25 * 2**20, 40e6 - 25 * 2**20]
    t = [lk.time("all_reduce", s, 4) for s in sizes]
    comp = Compute(0.1, 1.0, 0.0, 1, "x")  # backward long enough to hide the first bucket
    p = predict("DDP", m, fab, comp)
    assert p.comm_s == pytest.approx(sum(t))
    assert p.exposed_s == pytest.approx(t[1])
    assert p.step_s == pytest.approx(1.1 + t[1])


def test_overlap_hides_the_units_but_not_the_root():
    m = ModelComm(1_000_000, 100_000, [100_000] * 9)
    lk = link(bw=1e9)
    fab = Fabric(lk, lk, 1, 8)
    slow = Compute(10.0, 20.0, 0.0, 1, "x")
    p = predict("FULL_SHARD", m, fab, slow, overlap=1.0)
    fixed = lk.time("all_gather", 4e5, 8) + lk.time("reduce_scatter", 4e5, 8)
    assert p.exposed_s == pytest.approx(fixed)
    serial = predict("FULL_SHARD", m, fab, slow, overlap=0.0)
    assert serial.exposed_s == pytest.approx(serial.comm_s)
    assert serial.step_s == pytest.approx(30.0 + serial.comm_s)


def test_a_ring_across_nodes_pays_the_network_on_its_inter_node_steps():
    intra, inter = link(bw=400e9, hop=3e-6), link(bw=50e9 * 8, hop=10e-6, base=8e-6)
    fab = Fabric(intra, inter, nodes=4, gpus_per_node=8)
    s = 1e9
    flat = fab.group("all_reduce", s, 32, 4)
    steps, cross = 2 * 31, 2 * 3
    want = 8e-6 + (steps - cross) * 3e-6 + cross * 10e-6 + s * 2 * 31 / 32 / 400e9
    assert flat == pytest.approx(want)
    # HYBRID_SHARD's replicas: 8 groups (one per local rank) share each node's 8 ports
    rep = fab.group("all_reduce", s, 4, 4, per_node=8)
    assert rep == pytest.approx(8e-6 + 6 * 10e-6 + s * 2 * 3 / 4 / 50e9)


def test_presets_and_their_ports():
    ib = steptime_links.preset("ib400", ports=8)
    assert ib.busbw["all_reduce"] == pytest.approx(400e9)
    assert steptime_links.preset("eth100").busbw["all_gather"] == pytest.approx(12.5e9)
    assert steptime_links.preset("nvlink").busbw["reduce_scatter"] == pytest.approx(450e9)
    with pytest.raises(PlanError, match="unknown interconnect 'ib200'.*nvlink, ib400, eth100"):
        steptime_links.load_link("ib200")


def test_fit_recovers_latency_and_bandwidth_from_commbench_rows():
    n, hop, bw = 4, 50e-6, 2e9
    rows = []
    for op in OPS:
        for size in (2**12, 2**16, 2**20, 2**24):
            t = steptime_links.ring_steps(op, n) * hop + size * bus_factor(op, n) / bw
            rows.append({"op": op, "size_bytes": size, "time_us": t * 1e6})
    lk = steptime_links.fit_commbench({"world_size": n, "results": rows, "hosts": ["a"]})
    for op in OPS:
        assert lk.busbw[op] == pytest.approx(bw, rel=1e-6)
        assert lk.hop_s[op] == pytest.approx(hop, rel=1e-6)
    with pytest.raises(PlanError, match="measured on 1 rank"):
        steptime_links.fit_commbench({"world_size": 1, "results": rows})


BENCH = {
    "world_size": 2,
    "hosts": ["a"],
    "backend": "gloo",
    "results": [{"op": "all_reduce", "size_bytes": 4096, "time_us": 12.5}],
}
BENCHES = cases(
    damaged(BENCH, {"world_size": ("integer", "null"), "hosts": ("list", "null"),
                    "results": ("list",)})
)  # fmt: skip


@pytest.mark.parametrize("label", list(BENCHES))
def test_a_damaged_commbench_file_is_one_line(tmp_path, label):
    path = tmp_path / "commbench.json"
    path.write_bytes(BENCHES[label])
    with pytest.raises(PlanError) as e:
        steptime_links.load_link(str(path))
    assert str(e.value).startswith(f"cannot read commbench JSON {path}: ")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("row", [3, "x", None, [1], {}, {"op": "all_reduce", "size_bytes": "1"}])
def test_a_damaged_commbench_row_is_one_line(tmp_path, row):
    path = tmp_path / "commbench.json"
    path.write_text(json.dumps({**BENCH, "results": [row]}))
    with pytest.raises(PlanError, match=r"^cannot read commbench JSON .*: results\[0\]"):
        steptime_links.load_link(str(path))


def pred(name: str, step: float, fits: bool | None) -> Prediction:
    return Prediction(name, 8, 1, 0, step, 0, 0, step, 1, None, memory_bytes=10**9, fits=fits)


def test_recommendation_is_the_fastest_that_fits_and_flips_when_memory_does_not():
    preds = [pred("DDP", 1.0, True), pred("FULL_SHARD", 1.2, True)]
    assert steptime_plan.recommend(preds, 80 * 10**9)[0] == "DDP"
    preds[0].fits = False
    pick, why = steptime_plan.recommend(preds, 80 * 10**9)
    assert pick == "FULL_SHARD" and "DDP does not fit" in why
    preds[1].fits = False
    pick, why = steptime_plan.recommend(preds, 80 * 10**9)
    assert pick is None and why.startswith("nothing fits")


def test_within_five_percent_the_strategy_that_moves_less_wins():
    preds = [pred("FULL_SHARD", 1.00, True), pred("DDP", 1.04, True)]
    pick, why = steptime_plan.recommend(preds, None)
    assert pick == "DDP" and "within 5% of FULL_SHARD" in why
    preds[1].step_s = 1.10
    assert steptime_plan.recommend(preds, None)[0] == "FULL_SHARD"


def run_memory(capsys, *argv: str) -> tuple[int, str, str]:
    rc = memory.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--inter", "myrinet"], "unknown interconnect 'myrinet'"),
        (["--nodes", "0"], "--nodes 0"),
        (["--mfu", "1.5", "--peak-tflops", "989"], "--mfu 1.5 must be in (0, 1]"),
        (["--mfu", "0", "--peak-tflops", "989"], "--mfu 0 must be in (0, 1]"),
        (["--mfu", "0.4"], "--mfu needs --peak-tflops"),
        (["--overlap", "2"], "--overlap 2 must be in [0, 1]"),
        (["--strategy", "NO_SHARD"], "not NO_SHARD"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    rc, out, err = run_memory(capsys, "--model", "gpt", "--gpus", "8", "--step-time", *args)
    assert rc == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_mfu_needs_the_models_flops(capsys):
    rc, _, err = run_memory(
        capsys, "--model", "mlp", "--gpus", "8", "--step-time", "--mfu", "0.4", "--peak-tflops", "9"
    )
    assert rc == 2 and "registers none" in err


def test_an_unknown_preset_through_the_ddpkit_command(one_line_error):
    proc = subprocess.run(
        [PY, "-m", "ddpkit", "memory", "--model", "mlp", "--step-time", "--intra", "pcie9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "unknown interconnect 'pcie9'" in one_line_error(proc)
