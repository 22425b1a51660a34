"""Contention: a CPU row whose threads waited for a CPU while being timed is flagged (column,
reason, report), whatever the machine's load when the test runs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synth import env, ok_row, write_run

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import ceilings, contention, timing
from attnbench.measure.contention import Contention, Usage, between
from attnbench.measure.timing import TimerConfig
from attnbench.report.analysis import analyse
from attnbench.report.render.checks import checks_section
from attnbench.report.render.header import header_lines
from attnbench.run.measuring.row import Settings
from attnbench.store.results import read_results
from attnbench.testing import run_row

ROOT = Path(__file__).resolve().parent.parent


def test_shares_come_from_the_readings_and_each_rule_decides_where_it_applies():
    before = Usage(10.0, 5.0, {"1": 1.0, "2": 0.5})
    after = Usage(12.0, 6.0, {"1": 2.0, "2": 0.9, "3": 0.1})  # thread 3 started in between
    c = between(before, after, threads=2)
    assert c.cpu_share == pytest.approx(0.25)  # 1 s of CPU over 2 s x 2 threads
    assert c.wait_share == pytest.approx(1.5 / 4)  # 1.0 + 0.4 + 0.1 s waited
    assert c.contended and "waited for a CPU 38% of the time" in c.note()
    # the run-queue wait decides where it is known: a call that ran on one of two threads
    assert not Contention(cpu_share=0.5, wait_share=0.01, threads=2).contended
    assert Contention(cpu_share=0.9, wait_share=0.2, threads=2).contended
    # without it, the process must have run at least 0.8 of a core
    assert not Contention(cpu_share=0.45, wait_share=None, threads=2).contended
    assert Contention(cpu_share=0.35, wait_share=None, threads=2).contended
    assert "ran 0.70 cores on average" in Contention(0.35, None, 2).note()
    assert between(before, before, threads=2) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_a_timed_loop_sharing_its_cpu_with_a_busy_process_is_contended():
    """One torch thread and a spinning process pinned to the same CPU: the loop gets about
    half of it on any machine, idle or busy."""
    script = textwrap.dedent(
        """
        import os, subprocess, sys
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        import torch
        torch.set_num_threads(1)
        spin = "import os, sys; os.sched_setaffinity(0, {%d}); print(1, flush=True)\\nwhile 1: pass"
        busy = subprocess.Popen([sys.executable, "-c", spin % cpu], stdout=subprocess.PIPE)
        try:
            busy.stdout.readline()  # it is pinned and spinning
            from attnbench.measure.timing import TimerConfig, time_fn
            x = torch.randn(192, 192)
            c = time_fn(lambda: x @ x, "cpu", TimerConfig(rep_ms=400)).contention
            print(c.cpu_share, c.wait_share, c.contended)
        finally:
            busy.kill()
            busy.wait()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu_share, wait_share, contended = proc.stdout.split()
    assert contended == "True", proc.stdout
    assert float(cpu_share) < 0.8
    if wait_share != "None":
        assert float(wait_share) > contention.CONTENDED_WAIT


def test_a_contended_row_records_its_share_and_says_so(monkeypatch):
    monkeypatch.setattr(timing.contention, "between", lambda *a: Contention(0.3, 0.6, 2))
    impl = plugins.discover(entry_points=False)["naive"]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16)
    row = run_row(impl, case, settings=Settings(TimerConfig(rep_ms=1.0)))
    # the share of several timed slices is their wall-weighted mean: 0.3 up to rounding
    assert row["status"] == "ok" and row["cpu_share"] == pytest.approx(0.3)
    assert row["contended"] is True
    assert "contended: over the timed loop the process got 30%" in row["reason"]


def test_a_noisy_row_blames_another_process_only_where_the_loop_measured_one():
    """A short GPU call's spread alone is no evidence of another process (no CPU contention
    is measured there); a contended CPU loop is."""
    spread = (0.028, 0.030, 0.030, 0.031, 0.045)  # ms: a 30 µs call, p20-p80 over 10%
    gpu = timing.Timing(spread).notes()
    assert len(gpu) == 1 and gpu[0].startswith("noisy: the p20-p80 spread")
    assert "another process" not in gpu[0]
    quiet = timing.Timing(spread, contention=Contention(0.95, 0.01, 2)).notes()
    assert not any("another process" in n for n in quiet)
    busy = timing.Timing(spread, contention=Contention(0.3, 0.6, 2)).notes()
    assert [n.split(":")[0] for n in busy] == ["noisy", "contended"]
    assert "another process was using the CPU" in busy[1]


def test_the_report_counts_and_lists_contended_rows(tmp_path):
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16)
    rows = [
        {**ok_row("c", "naive", case, 1.0, 1.0), "cpu_share": 0.9, "contended": False},
        {**ok_row("c", "sdpa", case, 2.0, 1.0), "cpu_share": 0.2, "contended": True},
    ]
    df = read_results(write_run(tmp_path, "c", rows))
    text = "\n".join(checks_section(analyse(df, {}, "c")))
    assert "1 CPU row(s) were contended" in text and "lowest cpu_share 0.20" in text
    assert "| sdpa |" in text and "| naive |" not in text


def test_contended_ceiling_measurements_are_tried_again_and_said():
    tries = iter([(5.0, True), (3.0, False), (9.0, True), (4.0, False), (4.5, False), (99, 0)])
    assert ceilings.best(lambda: next(tries)) == (9.0, False)  # 3 clean tries, then it stops
    always = iter([(float(i), True) for i in range(ceilings.MAX_TRIES)])
    assert ceilings.best(lambda: next(always)) == (ceilings.MAX_TRIES - 1.0, True)


def test_the_report_says_when_the_ceilings_waited_for_the_cpu(tmp_path):
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16)
    run = write_run(tmp_path, "c", [ok_row("c", "naive", case, 1.0, 1.0)])
    df = read_results(run)
    ceil = {"matmul_tflops": {"float32": 0.05}, "matmul_n": 1024, "copy_gb_s": 10.0}
    quiet = {**env(), "ceilings": {**ceil, "contended": False}}
    busy = {**env(), "ceilings": {**ceil, "contended": True}}
    quiet, busy = ("\n".join(header_lines(analyse(df, e, "c"))) for e in (quiet, busy))
    assert "every try waited for the CPU" in busy and "every try waited" not in quiet
