"""Timers: CUDA events on the GPU (triton.testing.do_bench's method: warm-up by time, L2 flushed
before every sample; the sample count is bounded here, which do_bench does not allow),
torch.utils.benchmark on the CPU. Both return every sample, so the median and the spread come
from the same data, and both keep the count within [min_samples, max_samples].

Timing is done in rounds (``RoundTimer``): a case's impls take turns, each round a short
warm-up and then the impl's share of the round (rep_ms / rounds), so the machine's drift over
the case hits every impl alike. ``Slice`` is one impl's part of one round; ``Timing`` is made
from an impl's slices. ``time_fn`` times one function alone, in the same rounds."""

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
from attnbench.measure.flags import NOISY_SPREAD, PAGE_FAULTS_FLAG

L2_FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 today, as do_bench uses
ROUNDS = 5  # a case's impls are timed in this many interleaved rounds (docs/method.md)
CPU_ROUND_WARMUP_CALLS = 1  # each round after an impl's first: its caches and clocks again
CPU_WARMUP_CALLS = 2  # at least; more while calls still page-fault (the heap growing)
CPU_WARMUP_MAX_CALLS = 8
CPU_WARMUP_MAX_S = 4.0  # and at most about this long (or rep_ms), while calls still fault


@dataclass(frozen=True)
class Slice:
    """One impl's samples in one round, and what its timed loop saw (CPU: its calls, their
    page faults, its share of the CPU; CUDA: the clocks read meanwhile, recompiles)."""

    round: int
    samples_ms: tuple[float, ...]
    calls: int = 0
    faults: int = 0
    wall_s: float = 0.0
    contention: contention.Contention | None = None
    clocks: tuple = ()  # CUDA: NVML readings while the samples were taken (ClockSampler)
    recompiled: bool = False  # torch.compile compiled while the samples were taken


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]
    page_faults: float | None = None  # CPU: minor page faults per timed call (getrusage)
    contention: contention.Contention | None = None  # CPU: what the timed loop got of the CPU
    rounds: tuple[int, ...] = ()  # the round of each sample

    @classmethod
    def from_slices(cls, slices: list[Slice]) -> Timing:
        """An impl's timing over its rounds: every sample, page faults per call over all its
        calls, and its loops' CPU shares weighted by their wall time."""
        samples = tuple(t for s in slices for t in s.samples_ms)
        rounds = tuple(s.round for s in slices for _ in s.samples_ms)
        calls = sum(s.calls for s in slices)
        faults = sum(s.faults for s in slices) / calls if calls else None
        return cls(samples, faults, _combined(slices), rounds)

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
            "rounds": len(set(self.rounds)) or None,
        }
        if self.page_faults is not None:
            out["page_faults"] = self.page_faults
        if self.contention is not None:
            out.update(cpu_share=self.contention.cpu_share, contended=self.contention.contended)
        return out

    def notes(self) -> list[str]:
        """What flags the pass in the row's reason (docs/method.md): samples spread over
        NOISY_SPREAD, PAGE_FAULTS_FLAG page faults per call or more, a CPU the loop waited for.
        A cause is named only where the loop measured it: a spread alone does not say that
        another process was running (a GPU call of a few µs spreads on its own), the CPU
        contention measured over the loop does."""
        out = []
        if self.spread > NOISY_SPREAD:
            out.append(
                f"noisy: the p20-p80 spread of the samples is {100 * self.spread:.0f}% of "
                f"the median (over {100 * NOISY_SPREAD:.0f}%), so time_ms may move between "
                f"identical runs"
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
    rounds: int = ROUNDS  # rep_ms and the sample bounds are split over this many rounds

    def per_round(self) -> tuple[float, int, int]:
        """A round's time budget (ms) and its bounds on the sample count (at least 1)."""
        low = -(-self.min_samples // self.rounds)  # ceil: the rounds together reach min_samples
        return self.rep_ms / self.rounds, max(1, low), max(1, self.max_samples // self.rounds)


def time_fn(fn: Callable[[], object], device_type: str, cfg: TimerConfig = TimerConfig()) -> Timing:
    """``fn`` timed alone, in cfg.rounds rounds back to back."""
    timer = RoundTimer(fn, device_type, cfg)
    return Timing.from_slices([timer.round(r) for r in range(cfg.rounds)])


class RoundTimer:
    """One function's timer over a case's rounds: its first round warms it up fully (CPU: until
    the heap stops growing; CUDA: warmup_ms), each later one briefly (``warm_up``), then a
    round's share of the samples (``samples``). With cuda_graph the function is captured once
    and replayed."""

    def __init__(self, fn: Callable[[], object], device_type: str, cfg: TimerConfig):
        if cfg.cuda_graph and device_type != "cuda":
            raise ValueError("CUDA-graph timing needs a CUDA device")
        self.fn = cuda_graph.capture(fn) if cfg.cuda_graph else fn
        self.device_type, self.cfg = device_type, cfg
        self.warm = False
        self._estimate_ms: float | None = None

    def round(self, index: int) -> Slice:
        self.warm_up()
        return self.samples(index)

    def warm_up(self) -> None:
        """The first round's full warm-up, or a later round's short one."""
        if self.device_type == "cuda":
            if self._estimate_ms is None:
                self._estimate_ms = _estimate_cuda_ms(self.fn, _flush_buffer())
            warm_ms = self.cfg.warmup_ms / (self.cfg.rounds if self.warm else 1)
            for _ in range(max(1, int(warm_ms / self._estimate_ms))):
                self.fn()
        elif self.warm:
            for _ in range(CPU_ROUND_WARMUP_CALLS):
                self.fn()
        else:
            _warm_up_cpu(self.fn, self.cfg)
        self.warm = True

    def samples(self, index: int) -> Slice:
        """Round ``index``'s samples (after ``warm_up``)."""
        return self._cuda(index) if self.device_type == "cuda" else self._cpu(index)

    def _cpu(self, index: int) -> Slice:
        budget_ms, low, high = self.cfg.per_round()
        calls, fn = 0, self.fn

        def counted():
            nonlocal calls
            calls += 1
            return fn()

        faults, threads = minor_faults(), torch.get_num_threads()
        before = contention.usage()
        timer = tbench.Timer(stmt="fn()", globals={"fn": counted}, num_threads=threads)
        times = list(timer.blocked_autorange(min_run_time=budget_ms / 1e3).times)[:high]
        while len(times) < low:  # slow calls: top up with single-call samples
            start = time.perf_counter()
            counted()
            times.append(time.perf_counter() - start)
        after = contention.usage()
        return Slice(
            index,
            tuple(t * 1e3 for t in times),  # seconds per call, one per block of calls
            calls,
            minor_faults() - faults,
            after.wall_s - before.wall_s,
            contention.between(before, after, threads),
        )

    def _cuda(self, index: int) -> Slice:
        """do_bench's method with the sample count in our hands: the L2 flushed before every
        sample outside the timed region, one pair of CUDA events per sample."""
        budget_ms, low, high = self.cfg.per_round()
        flush = _flush_buffer()
        n = min(high, max(low, round(budget_ms / self._estimate_ms)))
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(n)
        ]
        for start, end in events:
            flush.zero_()
            start.record()
            self.fn()
            end.record()
        torch.cuda.synchronize()
        return Slice(index, tuple(start.elapsed_time(end) for start, end in events))


SAMPLE_MS = 2.0  # CPU, impls timed in turns: one sample is a block of calls of about this long


@dataclass
class _Turns:
    """One timer's part of ``interleaved``: its calls per sample, samples, time spent, calls
    and page faults so far."""

    timer: RoundTimer
    per_sample: int
    samples_ms: list
    spent_s: float = 0.0
    calls: int = 0
    faults: int = 0


def interleaved(timers: dict, index: int, failed: Callable[[object, Exception], None]) -> dict:
    """CPU: round ``index`` of several functions at once, in turns sample by sample (a sample is
    a block of calls of about SAMPLE_MS; a longer call is one sample, so long calls alternate
    call by call), the order rotated every turn, until each has its round's budget and sample
    count: a change of the machine's speed within the round hits every function alike, where
    one block per function let it land between them. ``timers``: key -> RoundTimer (warmed
    up: ``warm_up``); a function that raises leaves the turns and ``failed(key, exc)`` is
    called. Returns key -> Slice; each Slice's contention is the whole loop's."""
    threads = torch.get_num_threads()
    turns, dropped = {}, set()

    def drop(key, exc):
        dropped.add(key)
        failed(key, exc)

    for key, timer in timers.items():
        budget_ms, low, high = timer.cfg.per_round()
        try:
            start = time.perf_counter()
            timer.fn()
            once_s = max(time.perf_counter() - start, 1e-7)
        except Exception as exc:  # noqa: BLE001 - the caller makes the function's row
            drop(key, exc)
            continue
        turns[key] = _Turns(timer, max(1, round(SAMPLE_MS / 1e3 / once_s)), [])
    before, done, k = contention.usage(), set(), 0
    while len(done) < len(turns):
        keys = [key for key in turns if key not in done]
        for key in keys[k % len(keys) :] + keys[: k % len(keys)]:
            t = turns[key]
            try:
                faults, start = minor_faults(), time.perf_counter()
                for _ in range(t.per_sample):
                    t.timer.fn()
                elapsed = time.perf_counter() - start
                t.faults += minor_faults() - faults
            except Exception as exc:  # noqa: BLE001 - the caller makes the function's row
                drop(key, exc)
                done.add(key)
                continue
            t.samples_ms.append(elapsed * 1e3 / t.per_sample)
            t.spent_s, t.calls = t.spent_s + elapsed, t.calls + t.per_sample
            budget_ms, low, high = t.timer.cfg.per_round()
            n = len(t.samples_ms)
            if n >= high or (n >= low and t.spent_s * 1e3 >= budget_ms):
                done.add(key)
        k += 1
    after = contention.usage()
    shared, wall_s = contention.between(before, after, threads), after.wall_s - before.wall_s
    return {
        key: Slice(index, tuple(t.samples_ms), t.calls, t.faults, wall_s, shared)
        for key, t in turns.items()
        if key not in dropped
    }


def _flush_buffer() -> torch.Tensor:
    """A buffer larger than the L2 (the caching allocator hands the same block back)."""
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")


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


def _combined(slices: list[Slice]) -> contention.Contention | None:
    """The contention of several timed loops: their CPU and wait shares weighted by wall time."""
    parts = [(s.wall_s, s.contention) for s in slices if s.contention is not None and s.wall_s > 0]
    if not parts:
        return None
    wall = sum(w for w, _ in parts)
    cpu = sum(w * c.cpu_share for w, c in parts) / wall
    waits = [c.wait_share for _, c in parts]
    wait = None if None in waits else sum(w * c.wait_share for w, c in parts) / wall
    return contention.Contention(cpu, wait, parts[0][1].threads)


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
