"""ddpkit.tools.plot on metrics.jsonl files in the trainer's record format.

Here the tests that start processes; the in-process ones in tests/unit/tools/test_plot.py.
Helpers both use are in tests/unit/tools/test_plot.py."""

from __future__ import annotations

from pathlib import Path

from ddpkit.tools.plot import load_run

from tests.unit.tools.test_plot import _axes, plot, record, write_run


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_run_writes_charts_into_the_run_dir(tmp_path):
    run = write_run(
        tmp_path / "mlp",
        [record(s, 2.3 / s) for s in range(1, 21)],
        summary={"eval_loss": 0.2},
    )
    r = plot(str(run))
    assert r.returncode == 0, r.stderr
    for chart in ("loss", "lr", "throughput", "memory", "grad_norm"):
        assert is_png(run / f"{chart}.png"), chart
    assert "mlp: steps 1..20, loss 2.3000 -> 0.1150" in r.stdout


def test_several_runs_on_one_chart(tmp_path):
    a = write_run(tmp_path / "runs" / "ddp", [record(s, 2.0 / s) for s in range(1, 6)])
    b = write_run(tmp_path / "runs" / "fsdp", [record(s, 2.1 / s) for s in range(1, 9)])
    r = plot(str(a), str(b), "--x", "time")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "runs" / "compare"
    assert is_png(out / "loss.png") and is_png(out / "throughput.png")
    assert not (a / "loss.png").exists()  # the comparison does not touch the runs
    assert "ddp:" in r.stdout and "fsdp:" in r.stdout


def test_missing_metric_skips_its_chart(tmp_path):
    recs = [{k: v for k, v in record(s, 1.0).items() if k != "mem_bytes"} for s in range(1, 4)]
    run = write_run(tmp_path / "nomem", recs)
    r = plot(str(run), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert is_png(tmp_path / "o" / "loss.png")
    assert not (tmp_path / "o" / "memory.png").exists()


def test_tokens_and_samples_never_share_an_axis(tmp_path):
    from ddpkit.tools.plot import figures

    gpt = write_run(
        tmp_path / "gpt",
        [record(s, 5.0, throughput=50_000.0, throughput_unit="tokens/s") for s in range(1, 6)],
    )
    mlp = write_run(tmp_path / "mlp", [record(s, 2.0) for s in range(1, 6)])
    fig = figures([load_run(gpt), load_run(mlp)], "step")["throughput"]
    by_label = {ax.get_ylabel(): [ln.get_label() for ln in ax.get_lines()] for ax in _axes(fig)}
    assert by_label == {"tokens/s": ["gpt"], "samples/s": ["mlp"]}
    for ax in _axes(fig):
        top = max(max(ln.get_ydata()) for ln in ax.get_lines())
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] < 1.2 * top  # each on its own scale


def test_a_small_memory_change_is_not_a_cliff(tmp_path):
    from ddpkit.tools.plot import figures

    recs = [record(s, 1.0, mem_bytes=(700 + (7 if s > 10 else 0)) * 2**20) for s in range(1, 21)]
    ax = _axes(figures([load_run(write_run(tmp_path / "r", recs))], "step")["memory"])[0]
    lo, hi = ax.get_ylim()
    assert ax.get_ylabel() == "MiB" and lo == 0 and 707 <= hi < 800
    assert list(ax.get_lines()[0].get_ydata()[9:11]) == [700, 707]
    assert (707 - 700) / (hi - lo) < 0.02  # the step is under 2% of the axis height


def test_plot_runs_star_after_a_comparison(tmp_path):
    runs = tmp_path / "runs"
    a = write_run(runs / "a", [record(s, 2.0 / s) for s in range(1, 6)])
    b = write_run(runs / "b", [record(s, 2.1 / s) for s in range(1, 6)])
    first = plot(str(a), str(b))
    assert first.returncode == 0 and is_png(runs / "compare" / "loss.png")
    again = plot(*sorted(str(p) for p in runs.iterdir()))  # what `runs/*` expands to
    assert again.returncode == 0, again.stderr
    assert again.stderr == f"skipped {runs / 'compare'}: no metrics.jsonl (not a run dir)\n"
    assert "a:" in again.stdout and "b:" in again.stdout


def test_log_scale_when_values_span_decades(tmp_path):
    from ddpkit.tools.plot import figures

    recs = [record(s, 10.0 / s**1.5, grad_norm=5.0) for s in range(1, 101)]  # loss 10 -> 0.01
    figs = figures([load_run(write_run(tmp_path / "r", recs))], "step")
    assert _axes(figs["loss"])[0].get_yscale() == "log"
    assert _axes(figs["grad_norm"])[0].get_yscale() == "linear"  # constant: no decades
    # lr warms up from a value > 0 to 1e-3 within a factor 5: linear
    assert _axes(figs["lr"])[0].get_yscale() == "linear"


def test_eval_records_are_a_curve_on_the_loss_chart(tmp_path):
    from ddpkit.tools.plot import figures

    recs = [record(s, 2.0 / s) for s in range(1, 9)]
    recs += [{"step": 4, "eval_loss": 0.9, "eval_accuracy": 0.5, "time_s": 0.04}]
    recs += [{"step": 8, "eval_loss": 0.4, "eval_accuracy": 0.7, "time_s": 0.08}]
    run = load_run(write_run(tmp_path / "r", recs))
    assert [r["step"] for r in run.records] == list(range(1, 9))  # eval does not replace step 4
    ax = _axes(figures([run], "step")["loss"])[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["r eval"].get_xdata()) == [4, 8]
    assert list(lines["r eval"].get_ydata()) == [0.9, 0.4]
    assert len(lines["r"].get_xdata()) == 8
