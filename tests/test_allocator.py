"""Stable CPU timing: the allocator's thresholds reach the workers and this process, and page
faults inside the timing are counted per call and flagged (docs/method.md, CPU timing and the
allocator). How many faults a call takes is the kernel's and the machine's; what attnbench
controls is that glibc runs with the thresholds, seen in what glibc does with a large block."""

import ctypes
import multiprocessing as mp
import os

import pytest

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import allocator, timing
from attnbench.measure.timing import TimerConfig
from attnbench.run.measuring.row import Settings
from attnbench.testing import run_row

glibc = pytest.mark.skipif(not allocator.is_glibc(), reason="glibc only")
LARGE_BYTES = 64 * 2**20  # above glibc's default mmap threshold, which grows to 32 MiB at most


class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33)
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def large_block_kept() -> bool:
    """Whether glibc serves a LARGE_BYTES malloc from the heap (not from its own mmap: the
    mmap threshold) and keeps it mapped in the heap once freed (not trimmed: the trim
    threshold), read from mallinfo2: what the two thresholds decide."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2()
    block = libc.malloc(LARGE_BYTES)
    during = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    mmapped = during.hblkhd - before.hblkhd >= LARGE_BYTES
    trimmed = after.arena < during.arena  # the heap handed memory back
    return not mmapped and not trimmed


def has_mallinfo2() -> bool:
    return allocator.is_glibc() and hasattr(ctypes.CDLL(None), "mallinfo2")


mallinfo2 = pytest.mark.skipif(not has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")


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
    queue.put((os.environ.get("GLIBC_TUNABLES"), large_block_kept() if has_mallinfo2() else None))


@glibc
@pytest.mark.parametrize("enabled", [True, False])
def test_a_spawned_worker_runs_with_the_thresholds_and_the_parent_is_left_as_it_was(
    monkeypatch, enabled
):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with allocator.worker_environment(enabled):
        proc = ctx.Process(target=_env, args=(queue,))
        proc.start()
    seen, kept = queue.get(timeout=120)
    proc.join(30)
    assert seen == (allocator.tunables(None) if enabled else None)
    if kept is not None:  # glibc >= 2.33: the worker's glibc read them (and without them, not)
        assert kept is enabled
    assert "GLIBC_TUNABLES" not in os.environ


@glibc
def test_env_json_says_how_the_thresholds_were_applied():
    assert allocator.describe(True, isolate=True)["how"] == "GLIBC_TUNABLES in the worker processes"
    assert "mallopt" in allocator.describe(True, isolate=False)["how"]
    off = allocator.describe(False, isolate=True)
    assert off["enabled"] is False and off["GLIBC_TUNABLES"] is None


@mallinfo2
def test_with_the_thresholds_pinned_in_process_a_large_block_stays_in_the_heap():
    assert allocator.pin_in_process()
    assert large_block_kept()


def test_a_row_with_faults_inside_the_timing_records_and_flags_them(monkeypatch):
    count = iter(range(0, 10**9, 5000))  # each reading 5000 faults later than the last
    monkeypatch.setattr(timing, "minor_faults", lambda: next(count))
    impl = plugins.discover(entry_points=False)["naive"]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16)
    row = run_row(impl, case, settings=Settings(TimerConfig(rep_ms=1.0)))
    assert row["status"] == "ok" and row["page_faults"] > 0
    assert f"page faults inside the timing: {row['page_faults']:.0f} per call" in row["reason"]
