"""Timers: CUDA events on the GPU (triton.testing.do_bench's method: warm-up by time, L2 flushed
before every sample; the sample count is bounded here, which do_bench does not allow),
torch.utils.benchmark on the CPU. Both return every sample, so the median and the spread come
from the same data, and both keep the count within [min_samples, max_samples]."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.utils.benchmark as tbench

from attnbench.measure import contention, cuda_graph
from attnbench.measure.allocator import minor_faults

L2_FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 today, as do_bench uses
# a row whose p20-p80 spread is more than this fraction of its median is flagged as noisy: its
# median can move between identical runs by more than most changes one wants to see
NOISY_SPREAD = 0.10
CPU_WARMUP_CALLS = 2  # at least; more while calls still page-fault (the heap growing)
CPU_WARMUP_MAX_CALLS = 8
CPU_WARMUP_MAX_S = 4.0  # and at most about this long (or rep_ms), while calls still fault
# a CPU row with at least this many minor page faults (4 KiB pages) per timed call is flagged:
# its calls page memory back in (the allocator handed it to the OS), which makes time_ms
# unstable; a few faults per call are the timer's own bookkeeping
PAGE_FAULTS_FLAG = 10.0


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]
    page_faults: float | None = None  # CPU: minor page faults per timed call (getrusage)
    contention: contention.Contention | None = None  # CPU: what the timed loop got of the CPU

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def p20_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 20))

    @property
    def p80_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 80))

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the fraction of the median the middle samples spread over."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def columns(self) -> dict:
        """The row's timing columns: median, p20, p80 and sample count; on the CPU also the
        page faults per call and the timed loop's share of the CPU."""
        out = {
            "time_ms": self.median_ms,
            "time_ms_p20": self.p20_ms,
            "time_ms_p80": self.p80_ms,
            "samples": len(self.samples_ms),
        }
        if self.page_faults is not None:
            out["page_faults"] = self.page_faults
        if self.contention is not None:
            out.update(cpu_share=self.contention.cpu_share, contended=self.contention.contended)
        return out

    def notes(self) -> list[str]:
        """What flags the pass in the row's reason (docs/method.md): samples spread over
        NOISY_SPREAD, PAGE_FAULTS_FLAG page faults per call or more, a CPU the loop waited for."""
        out = []
        if self.spread > NOISY_SPREAD:
            out.append(
                f"noisy: the p20-p80 spread of the samples is {100 * self.spread:.0f}% of "
                f"the median (over {100 * NOISY_SPREAD:.0f}%), so time_ms may move between "
                f"identical runs; another process may be using the device"
            )
        if self.page_faults is not None and self.page_faults >= PAGE_FAULTS_FLAG:
            out.append(
                f"page faults inside the timing: {self.page_faults:.0f} per call; "
                f"timed calls paged memory in (the heap grew, or the allocator handed "
                f"memory back to the OS between calls), so time_ms includes it and may "
                f"move between identical runs"
            )
        if self.contention is not None and self.contention.contended:
            out.append(self.contention.note())
        return out


@dataclass(frozen=True)
class TimerConfig:
    warmup_ms: float = 25.0  # GPU warm-up, by time
    rep_ms: float = 100.0  # time spent measuring (CPU: blocked_autorange's min_run_time)
    min_samples: int = 5  # slow calls still get this many samples
    max_samples: int = 200  # fast calls get at most this many samples
    cuda_graph: bool = False  # CUDA: time replays of a CUDA graph of fn (measure/cuda_graph.py)


def time_fn(fn: Callable[[], object], device_type: str, cfg: TimerConfig = TimerConfig()) -> Timing:
    if device_type == "cuda":
        return _time_cuda(cuda_graph.capture(fn) if cfg.cuda_graph else fn, cfg)
    if cfg.cuda_graph:
        raise ValueError("CUDA-graph timing needs a CUDA device")
    return _time_cpu(fn, cfg)


def _time_cpu(fn: Callable[[], object], cfg: TimerConfig) -> Timing:
    _warm_up_cpu(fn, cfg)
    calls = 0

    def counted():
        nonlocal calls
        calls += 1
        return fn()

    faults, threads = minor_faults(), torch.get_num_threads()
    before = contention.usage()
    timer = tbench.Timer(stmt="fn()", globals={"fn": counted}, num_threads=threads)
    m = timer.blocked_autorange(min_run_time=cfg.rep_ms / 1e3)
    times = list(m.times)[: cfg.max_samples]  # seconds per call, one per block of calls
    while len(times) < cfg.min_samples:  # slow calls: top up with single-call samples
        start = time.perf_counter()
        counted()
        times.append(time.perf_counter() - start)
    used = contention.between(before, contention.usage(), threads)
    faults = (minor_faults() - faults) / max(calls, 1)
    return Timing(tuple(t * 1e3 for t in times), page_faults=faults, contention=used)


def _warm_up_cpu(fn: Callable[[], object], cfg: TimerConfig) -> None:
    """First-call allocations and lazy init, then the heap's growth: calls go on until two
    calls in a row page-fault less than PAGE_FAULTS_FLAG times, for at most
    CPU_WARMUP_MAX_CALLS calls and about max(rep_ms, CPU_WARMUP_MAX_S). With the allocator's
    thresholds raised the heap stops growing after a few calls (slow calls that allocate
    hundreds of MiB, e.g. the math backend's decode at B4 Skv 4096, grow it now and then over
    their first five or so; docs/method.md); without them every call faults and a cap ends
    the warm-up."""
    start, quiet = time.perf_counter(), 0
    for i in range(CPU_WARMUP_MAX_CALLS):
        before = minor_faults()
        fn()
        quiet = quiet + 1 if minor_faults() - before < PAGE_FAULTS_FLAG else 0
        if i + 1 >= CPU_WARMUP_CALLS and (
            quiet >= 2 or time.perf_counter() - start > max(cfg.rep_ms / 1e3, CPU_WARMUP_MAX_S)
        ):
            return


def sample_count(rep_ms: float, call_ms: float, cfg: TimerConfig) -> int:
    """Samples for a time budget: rep_ms / one call, within [min_samples, max_samples]."""
    return min(cfg.max_samples, max(cfg.min_samples, round(rep_ms / max(call_ms, 1e-6))))


def _time_cuda(fn: Callable[[], object], cfg: TimerConfig) -> Timing:
    """do_bench's method with the sample count in our hands: warm-up by time, the L2 flushed
    before every sample outside the timed region, one pair of CUDA events per sample."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    estimate_ms = _estimate_cuda_ms(fn, flush)
    for _ in range(max(1, int(cfg.warmup_ms / estimate_ms))):
        fn()
    n = sample_count(cfg.rep_ms, estimate_ms, cfg)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return Timing(tuple(start.elapsed_time(end) for start, end in events))


def _estimate_cuda_ms(fn: Callable[[], object], flush: torch.Tensor, calls: int = 5) -> float:
    """Mean time of one call preceded by an L2 flush, as do_bench estimates it."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) / calls, 1e-3)
