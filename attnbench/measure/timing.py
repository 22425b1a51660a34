"""Timers: CUDA events (triton's do_bench when present) on the GPU, torch.utils.benchmark on
the CPU. Both return every sample so the median and spread come from the same data."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.utils.benchmark as tbench

L2_FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 today, as do_bench uses


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def p20_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 20))

    @property
    def p80_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 80))


@dataclass(frozen=True)
class TimerConfig:
    warmup_ms: float = 25.0  # GPU warm-up, by time
    rep_ms: float = 100.0  # time spent measuring (GPU: do_bench's rep; CPU: blocked_autorange)
    min_samples: int = 5  # slow calls still get this many samples
    max_samples: int = 200  # GPU: fast calls get at most this many samples


def time_fn(fn: Callable[[], object], device_type: str, cfg: TimerConfig = TimerConfig()) -> Timing:
    if device_type == "cuda":
        return _time_cuda(fn, cfg)
    return _time_cpu(fn, cfg)


def _time_cpu(fn: Callable[[], object], cfg: TimerConfig) -> Timing:
    fn()  # warm-up (first-call allocations, lazy init)
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=cfg.rep_ms / 1e3)
    times = list(m.times)  # seconds per call, one entry per block of m.number_per_run calls
    while len(times) < cfg.min_samples:  # slow calls: top up with single-call samples
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return Timing(tuple(t * 1e3 for t in times))


def _time_cuda(fn: Callable[[], object], cfg: TimerConfig) -> Timing:
    try:
        from triton.testing import do_bench
    except ImportError:
        return _time_cuda_events(fn, cfg)
    # do_bench: warm-up by time, L2 flushed before every sample outside the events, CUDA events.
    # It takes rep / (time of one flushed call) samples: bound that count both ways.
    estimate_ms = _estimate_cuda_ms(fn, flush=True)
    rep_ms = max(min(cfg.rep_ms, estimate_ms * cfg.max_samples), estimate_ms * cfg.min_samples)
    samples = do_bench(fn, warmup=cfg.warmup_ms, rep=rep_ms, return_mode="all")
    return Timing(tuple(float(s) for s in samples))


def _estimate_cuda_ms(fn: Callable[[], object], flush: bool, calls: int = 5) -> float:
    """Mean time of one call (preceded by an L2 flush when ``flush``), as do_bench estimates."""
    buffer = torch.empty(L2_FLUSH_BYTES if flush else 0, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        buffer.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) / calls, 1e-3)


def _time_cuda_events(fn: Callable[[], object], cfg: TimerConfig) -> Timing:
    """The same method as do_bench, for machines without triton."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    estimate_ms = _estimate_cuda_ms(fn, flush=False)
    for _ in range(max(1, int(cfg.warmup_ms / estimate_ms))):
        fn()
    n = min(cfg.max_samples, max(1, int(cfg.rep_ms / estimate_ms)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for s, e in events:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return Timing(tuple(s.elapsed_time(e) for s, e in events))
