"""tests/acct.py: the kernel's accounting records read and put under the part of a run that
started them."""

from __future__ import annotations

from tests import acct


def record(pid: int, ppid: int, start: int, seconds: float, cpu_ticks: int, comm: str) -> bytes:
    return acct.RECORD.pack(
        0, 3, 0, 0, 0, 0, pid, ppid, start, seconds * acct.AHZ,
        cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm.encode(),
    )  # fmt: skip


def test_comp_t_keeps_its_exponent():
    assert acct.comp_t(250) == 2.5  # no exponent: ticks
    assert acct.comp_t((1 << 13) | 1000) == 80.0  # 1000 * 8 ticks


def test_a_process_counts_under_the_daemon_it_descends_from_even_when_its_pid_was_reused(tmp_path):
    path = tmp_path / "run.acct"
    path.write_bytes(
        b"".join([
            record(100, 1, 1000, 900, 50, "slurmstepd"),
            record(101, 100, 1010, 30, 400, "bash"),  # a job's shell
            record(102, 101, 1011, 20, 900, "pt_gloo_runloop"),  # its torchrun worker
            record(200, 1, 1000, 900, 120, "kube-apiserver-v1"),
            record(300, 1, 1500, 100, 700, "python"),  # pytest
            record(101, 300, 1600, 5, 300, "pt_elastic"),  # pid 101 again, under pytest
            record(102, 101, 1601, 4, 200, "python"),  # ... and 102: the new 101's child
            record(400, 300, 1700, 2, 6, "kubectl"),
            b"\x00\x02" + bytes(62),  # a v2 record: skipped
        ])
    )  # fmt: skip
    procs = acct.read(path)
    assert len(procs) == 8 and procs[1].end == 1040.0
    groups = acct.attribute(procs)
    assert groups["SLURM jobs (under slurmstepd)"] == (13.5, 3)
    assert groups["Kubernetes control plane"] == (1.2, 1)
    assert groups["kubectl"] == (0.06, 1)
    assert groups[acct.OWN] == (12.0, 3)
    lines = acct.report(procs)
    assert lines[0] == "8 processes ended, 27 CPU-s"
    assert "SLURM jobs" in lines[1] and "50.4%" in lines[1]  # 13.5 of 26.76


def test_switching_accounting_without_root_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(acct, "switch", lambda path: (_ for _ in ()).throw(OSError(1, "x")))
    assert acct.main(["off"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
