"""Stable CPU timing: the allocator's thresholds reach the workers and this process, and page
faults inside the timing are counted per call and flagged (docs/method.md, CPU timing and the
allocator)."""

import multiprocessing as mp
import os

import pytest
import torch

from attnbench import registry
from attnbench.case import Case
from attnbench.measure import allocator, timing
from attnbench.measure.timing import PAGE_FAULTS_FLAG, TimerConfig, time_fn
from attnbench.run.inputs import make_inputs
from attnbench.run.row import Settings, ground_truth, measure

glibc = pytest.mark.skipif(not allocator.is_glibc(), reason="glibc only")


def test_tunables_are_added_and_settings_already_given_win():
    assert allocator.tunables(None) == (
        "glibc.malloc.trim_threshold=4294967296:glibc.malloc.mmap_threshold=4294967296"
    )
    mixed = allocator.tunables("glibc.malloc.trim_threshold=1:glibc.malloc.arena_max=2")
    assert mixed.split(":") == [
        "glibc.malloc.trim_threshold=1",
        "glibc.malloc.arena_max=2",
        "glibc.malloc.mmap_threshold=4294967296",
    ]


def _env(queue):
    queue.put(os.environ.get("GLIBC_TUNABLES"))


@glibc
@pytest.mark.parametrize("enabled", [True, False])
def test_a_spawned_worker_starts_with_the_tunables_and_the_parent_is_left_as_it_was(
    monkeypatch, enabled
):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with allocator.worker_environment(enabled):
        proc = ctx.Process(target=_env, args=(queue,))
        proc.start()
    seen = queue.get(timeout=120)
    proc.join(30)
    assert seen == (allocator.tunables(None) if enabled else None)
    assert "GLIBC_TUNABLES" not in os.environ


@glibc
def test_env_json_says_how_the_thresholds_were_applied():
    assert allocator.describe(True, isolate=True)["how"] == "GLIBC_TUNABLES in the worker processes"
    assert "mallopt" in allocator.describe(True, isolate=False)["how"]
    off = allocator.describe(False, isolate=True)
    assert off["enabled"] is False and off["GLIBC_TUNABLES"] is None


@glibc
def test_with_the_thresholds_pinned_a_large_allocation_does_not_fault_every_call():
    assert allocator.pin_in_process()
    x = torch.randn(1, 4, 1024, 64)

    def scores():  # 16 MiB of scores per call, freed at the end of it
        return (x @ x.transpose(-1, -2)).softmax(-1) @ x

    t = time_fn(scores, "cpu", TimerConfig(rep_ms=50, min_samples=5))
    assert t.page_faults is not None and t.page_faults < PAGE_FAULTS_FLAG


def test_a_row_with_faults_inside_the_timing_records_and_flags_them(monkeypatch):
    count = iter(range(0, 10**9, 5000))  # each reading 5000 faults later than the last
    monkeypatch.setattr(timing, "minor_faults", lambda: next(count))
    impl = registry.discover(entry_points=False)["naive"]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16)
    inputs = make_inputs(case, 0)
    row = measure(
        impl, case, inputs, ground_truth(case, inputs), Settings(TimerConfig(rep_ms=1.0))
    ).row
    assert row["status"] == "ok" and row["page_faults"] > 0
    assert f"page faults inside the timing: {row['page_faults']:.0f} per call" in row["reason"]
