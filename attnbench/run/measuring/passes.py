"""A row's passes beside its timing: the memory pass (peak_mem_mib) and the profiled pass
(CUDA: the profiler's kernel time per call, cross-checked against the median; with --profile
a Chrome trace and the kernel table), each in an NVTX range that nsys and ncu show. The
profiled calls run inside the last timing round (``profile_in_round``), at its clocks."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from attnbench.case import Case
from attnbench.measure.clocks import ClockSampler, summarize
from attnbench.measure.memory import MemoryUnavailable, peak_mem_mib
from attnbench.measure.profiling import Profile, cross_check_due, mismatch_note, profile_fn
from attnbench.registry import Impl
from attnbench.run.measuring.call import Call


def memory(impl: Impl, case: Case, call: Call, notes: list[str]) -> float | None:
    """The memory pass: peak_mem_mib, or blank with a note where it cannot be measured."""
    try:
        with nvtx(f"{impl.name} {case.label()} memory"):
            return peak_mem_mib(call.memory_fn(), case.device_type)
    except MemoryUnavailable as exc:
        notes.append(f"peak_mem_mib not measured: {exc}")
        return None


def profile_due(impl: Impl, case: Case, settings) -> bool:
    """Whether this row gets a profiled pass: with --profile where it matches, and on CUDA on
    a sample (the first and every tenth row of each impl: profiling.cross_check_due). Asked
    once per row, at its check."""
    wanted = settings.profiles(impl, case)
    cuda_due = case.device_type == "cuda" and (
        settings.profile is not None or cross_check_due(impl.name)
    )
    return bool(wanted or cuda_due)


def profile_in_round(impl: Impl, case: Case, call: Call, settings) -> InRound:
    """The profiled calls, taken inside the last timing round right after its samples, so
    that they run at the timed samples' clocks (a profile after an idle moment ran at higher
    clocks than timed rounds at the power cap); the SM clock sampled meanwhile."""
    trace = None
    if settings.profiles(impl, case) and settings.traces_dir is not None:
        trace = settings.traces_dir / f"{impl.name}__{_slug(case.label())}.json"
    with nvtx(f"{impl.name} {case.label()} profile"), ClockSampler(case.device) as clocks:
        prof = profile_fn(call.timed_fn(), case.device_type, trace_path=trace)
    return InRound(prof, summarize(clocks.samples)["sm_clock_mhz"])


@dataclass(frozen=True)
class InRound:
    profile: Profile
    sm_clock_mhz: float | None  # median SM clock while the profiled calls ran


def profile(impl: Impl, case: Case, settings, row: dict, notes: list[str],
            in_round: InRound | None) -> tuple[dict, list[dict]]:  # fmt: skip
    """A profiled row's columns, for run/measuring/row.py to fill: the profiler's kernel time per
    call (``profiler_ms``) and the SM clock it ran at (``profiler_sm_clock_mhz``), cross-checked
    against the ``row``'s median at like clocks (profiling.mismatch_note); with --profile
    also the kernel table of the matching pairs. ``in_round``: the profile taken in the last
    timing round; None: none was due."""
    if in_round is None:
        return {}, []
    prof = in_round.profile
    note = mismatch_note(
        row["time_ms"], prof.device_ms_per_call, row.get("sm_clock_mhz"), in_round.sm_clock_mhz
    )
    if note:
        notes.append(note)
    columns = dict(profiler_ms=prof.device_ms_per_call, profiler_sm_clock_mhz=in_round.sm_clock_mhz)
    return columns, prof.kernels if settings.profiles(impl, case) else []


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def nvtx(name: str):
    """An NVTX range (seen by nsys / ncu) when CUDA is up; nothing otherwise."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
