"""Measurement details that would mislead on a GPU, checked on the CPU: what the profiler sum
counts, the grad mode of backend detection, sample-count bounds, and that a case's reference
is made outside its rows' timeouts."""

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from attnbench.case import Case
from attnbench.measure.profiling import device_events
from attnbench.measure.timing import TimerConfig, time_fn
from attnbench.registry import Impl
from attnbench.run.executing.local import InProcess
from attnbench.run.executing.worker import Worker, WorkerSpec
from attnbench.run.measuring.row import Settings
from attnbench.store.results import read_results

ROOT = Path(__file__).resolve().parent.parent


def in_process(timer: TimerConfig) -> Worker:
    spec = WorkerSpec(settings=Settings(timer))
    return Worker(spec, InProcess(spec))


def event(name, start_us, end_us, device=DeviceType.CUDA, annotation=False):
    return FunctionEvent(
        id=0,
        name=name,
        thread=0,
        start_us=start_us,
        end_us=end_us,
        device_type=device,
        is_user_annotation=annotation,
    )


def test_the_profiler_sum_counts_device_work_not_annotation_spans():
    events = [
        event("## Call CompiledFxGraph abc ##", 0, 100, annotation=True),  # spans both kernels
        event("triton_poi_fused_0", 0, 40),
        event("triton_red_fused_1", 45, 100),
        event("aten::mm", 0, 10, device=DeviceType.CPU),
    ]
    kept = device_events(events)
    assert [e.name for e in kept] == ["triton_poi_fused_0", "triton_red_fused_1"]
    assert sum(e.time_range.elapsed_us() for e in kept) == 95  # not 195


def test_backend_is_detected_in_the_timed_pass_grad_mode():
    seen, detecting = [], []

    def attend(q, k, v, *, causal, scale):
        if detecting:  # the grad mode the impl runs in while its backend is detected
            seen.append(torch.is_grad_enabled())
        return (q @ k.mT) @ v

    def detect(run, device_type):
        detecting.append(True)
        run()
        detecting.clear()
        return "fake"

    impl = Impl(name="fake_sdpa", fn=attend, backend=detect)
    for mode, grad in (("fwd", False), ("bwd", True)):
        case = Case(batch=1, heads=1, kv_heads=1, seq_q=8, seq_kv=8, head_dim=4, mode=mode)
        (row,) = [
            m.row for m in in_process(TimerConfig(rep_ms=1, min_samples=1)).run_case(case, [impl])
        ]
        assert row["status"] == "ok" and row["backend"] == "fake"
        assert seen and seen[-1] is grad, mode


def test_cpu_sample_count_stays_within_its_bounds():
    cfg = TimerConfig(rep_ms=50, min_samples=3, max_samples=7)
    assert 3 <= len(time_fn(lambda: None, "cpu", cfg).samples_ms) <= 7
    slow = TimerConfig(rep_ms=1, min_samples=4, max_samples=7)
    assert (
        len(time_fn(lambda: torch.ones(300, 300) @ torch.ones(300, 300), "cpu", slow).samples_ms)
        >= 4
    )


def test_prepare_makes_inputs_and_reference_before_any_row():
    impl = Impl(name="plain", fn=lambda q, k, v, *, causal, scale: q)
    case = Case(batch=1, heads=1, kv_heads=1, seq_q=8, seq_kv=8, head_dim=4)
    gpu_only = Impl(name="gpu_only", fn=None, devices=("cuda",))
    worker = in_process(TimerConfig(rep_ms=1, min_samples=1))
    (row,) = [m.row for m in worker.run_case(case, [gpu_only])]  # no impl can run it
    assert (
        row["status"] == "unsupported" and worker.transport.steps.prepared is None
    )  # nothing made
    list(worker.run_case(case, [impl]))
    prepared = worker.transport.steps.prepared
    assert prepared.case == case and prepared.inputs is not None and prepared.truth is not None


@pytest.mark.slow  # a sweep with a deliberately slow reference: minutes on 2 cores
def test_a_slow_reference_does_not_count_against_the_row_timeout(tmp_path):
    """The timeout is 40 times what one such row takes here and now (at least 5 s), so a busy
    machine cannot make the row itself time out; the reference sleeps 2 s longer than it."""
    case = Case(batch=1, heads=1, kv_heads=1, seq_q=16, seq_kv=16, head_dim=8)
    impl = Impl(name="quick", fn=lambda q, k, v, *, causal, scale: q * scale)
    started = time.perf_counter()
    (row,) = [m.row for m in in_process(TimerConfig(rep_ms=2.0)).run_case(case, [impl])]
    assert row["status"] == "ok"
    timeout = max(5, math.ceil(40 * (time.perf_counter() - started)))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "sweep.py"),
            "--device",
            "cpu",
            "--no-progress",
            "--no-report",
            "--plugin",
            str(ROOT / "tests" / "plugins" / "slow_reference.py"),
            "--impls",
            "quick",
            "--batch",
            "1",
            "--heads",
            "1",
            "--seq-len",
            "16",
            "--head-dim",
            "8",
            "--causal",
            "false",
            "--mode",
            "fwd",
            "--dtype",
            "float32",
            "--rep-ms",
            "2",
            "--timeout",
            str(timeout),
            "--results-dir",
            str(tmp_path),
            "--run-id",
            "r",
        ],
        capture_output=True,
        text=True,
        timeout=300 + timeout,
        env={**os.environ, "ATTNBENCH_REFERENCE_SLEEP_S": str(timeout + 2)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = read_results(tmp_path / "r").iloc[0]
    assert row["status"] == "ok", row["reason"]  # the reference outlasts the timeout: still ok
