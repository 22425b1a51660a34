"""A row's passes after its timing: the memory pass (peak_mem_mib) and the profiled pass
(CUDA: the profiler's kernel time per call, cross-checked against the median; with --profile
a Chrome trace and the kernel table), each in an NVTX range that nsys and ncu show."""

from __future__ import annotations

import contextlib
import re

import torch

from attnbench.case import Case
from attnbench.measure.memory import MemoryUnavailable, peak_mem_mib
from attnbench.measure.profiling import cross_check_due, mismatch_note, profile_fn
from attnbench.registry import Impl
from attnbench.run.call import Call


def memory(impl: Impl, case: Case, call: Call, notes: list[str]) -> float | None:
    """The memory pass: peak_mem_mib, or blank with a note where it cannot be measured."""
    try:
        with nvtx(f"{impl.name} {case.label()} memory"):
            return peak_mem_mib(call.memory_fn(), case.device_type)
    except MemoryUnavailable as exc:
        notes.append(f"peak_mem_mib not measured: {exc}")
        return None


def profile(
    impl: Impl, case: Case, call: Call, settings, row: dict, notes: list[str]
) -> list[dict]:
    """CUDA rows: the profiler's kernel time per call (``profiler_ms``), cross-checked
    against the median, on every row with --profile and else on a sample (the first and every
    tenth row of each impl: profiling.cross_check_due). With --profile also a Chrome trace and
    the kernel table of the matching pairs."""
    wanted = settings.profiles(impl, case)
    cuda_due = case.device_type == "cuda" and (
        settings.profile is not None or cross_check_due(impl.name)
    )
    if not (wanted or cuda_due):
        return []
    trace = None
    if wanted and settings.traces_dir is not None:
        trace = settings.traces_dir / f"{impl.name}__{_slug(case.label())}.json"
    with nvtx(f"{impl.name} {case.label()} profile"):
        prof = profile_fn(call.timed_fn(), case.device_type, trace_path=trace)
    row["profiler_ms"] = prof.device_ms_per_call
    note = mismatch_note(row["time_ms"], prof.device_ms_per_call)
    if note:
        notes.append(note)
    return prof.kernels if wanted else []


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def nvtx(name: str):
    """An NVTX range (seen by nsys / ncu) when CUDA is up; nothing otherwise."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
