"""What ran: torch.profiler around a few calls of a measured function. Gives the kernels (GPU)
or ops (CPU) with their counts, total time and share, the kernel time per call that the
harness's own median is cross-checked against, and optionally a Chrome trace."""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from attnbench.measure.flags import CROSS_CHECK_EVERY, MISMATCH_PCT

PROFILED_CALLS = 3
_rows_seen: Counter[str] = Counter()


def cross_check_due(impl: str) -> bool:
    """True for the 1st, 11th, 21st... row of ``impl`` that reaches the cross-check in this
    process (a worker that is replaced after a crash starts counting again)."""
    n = _rows_seen[impl]
    _rows_seen[impl] += 1
    return n % CROSS_CHECK_EVERY == 0


@contextlib.contextmanager
def quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def profiled(activities, **kwargs):
    """A started profiler, stopped on exit; its C++ start/stop lines on stderr (which would
    garble the progress bar) are silenced. CPU only: ``torch.autograd.profiler.profile``,
    which records the same events without torch.profiler's import of torch.compile's
    machinery at its start (seconds, once in every worker process); its results are
    ``prof.kineto_results``. Else ``torch.profiler.profile`` (``prof.profiler.kineto_results``)."""
    from torch.profiler import ProfilerActivity, profile

    if set(activities) == {ProfilerActivity.CPU}:
        from torch.autograd.profiler import profile as cpu_profile

        prof = cpu_profile(use_cpu=True, **kwargs)
        start, stop = prof.__enter__, lambda: prof.__exit__(None, None, None)
    else:
        prof = profile(activities=activities, **kwargs)
        start, stop = prof.start, prof.stop
    with quiet_stderr():
        start()
    try:
        yield prof
    finally:
        with quiet_stderr():
            stop()


@dataclass(frozen=True)
class Profile:
    kernels: list[dict]  # {"kernel", "calls", "total_us", "share"} per kernel name, per call set
    device_ms_per_call: float | None  # summed device kernel time / calls (GPU only)


def profile_fn(
    fn: Callable[[], object],
    device_type: str,
    *,
    calls: int = PROFILED_CALLS,
    trace_path: Path | None = None,
) -> Profile:
    """Run ``fn`` ``calls`` times under the profiler (after one warm call)."""
    cuda = device_type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    totals, counts = defaultdict(float), defaultdict(int)
    for event in device_events(prof.events()) if cuda else prof.events():
        if cuda:
            totals[event.name] += event.time_range.elapsed_us()  # a kernel's own span
        elif event.device_type == DeviceType.CPU:
            totals[event.name] += event.self_cpu_time_total  # us, self time: no double count
        else:
            continue
        counts[event.name] += 1
    whole = sum(totals.values()) or 1.0
    kernels = sorted(
        (
            {"kernel": name, "calls": counts[name], "total_us": us, "share": us / whole}
            for name, us in totals.items()
        ),
        key=lambda k: -k["total_us"],
    )
    per_call = sum(totals.values()) / calls / 1e3 if cuda and totals else None
    return Profile(kernels, per_call)


def device_events(events) -> list:
    """The device's own work among profiler events: kernels, copies and fills. Not the GPU
    twins of ``record_function`` ranges (user annotations, such as inductor's ``## Call
    CompiledFxGraph ##``), which span the kernels they contain and would count them twice."""
    return [
        e
        for e in events
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]


def mismatch_note(time_ms: float, profiler_ms: float | None, timed_mhz: float | None = None,
                  profiler_mhz: float | None = None) -> str | None:  # fmt: skip
    """A note when the harness's median and the profiler's kernel time disagree beyond 5%.
    Like with like: where both SM clocks are known (the timed samples', the profiled calls')
    and differ by more than 1%, the two are compared in SM cycles (time x clock), and the note
    names both clocks."""
    if profiler_ms is None or not time_ms:
        return None
    timed, profiled, unit = time_ms, profiler_ms, ""
    if timed_mhz and profiler_mhz and abs(timed_mhz - profiler_mhz) > 0.01 * timed_mhz:
        timed, profiled = time_ms * timed_mhz, profiler_ms * profiler_mhz
        unit = f" in SM cycles (clocks {timed_mhz:.0f} vs {profiler_mhz:.0f} MHz)"
    diff = (timed / profiled - 1) * 100  # how much longer the timer saw than the kernels
    if abs(diff) <= MISMATCH_PCT:
        return None
    why = "idle gaps between kernels (host overhead)" if diff > 0 else "kernels overlapping"
    return (
        f"time_ms {time_ms:.4g} vs profiler kernel time {profiler_ms:.4g} ms per call "
        f"({diff:+.0f}%{unit}; likely {why})"
    )
