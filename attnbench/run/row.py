"""One case and one row: inputs and the float64 reference once per case; per impl a checked
call, accuracy, compile time, backend, a timing pass, a memory pass and a profiled pass. A
failure at any step is a row with a status and a reason and every metric blank."""

from __future__ import annotations

import contextlib
import gc
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from attnbench.case import MODE_FLOP_FACTOR, Case
from attnbench.measure import agreement, cuda_graph, diagnose
from attnbench.measure.agreement import Truth
from attnbench.measure.backends import borrowed_note
from attnbench.measure.clocks import ClockSampler
from attnbench.measure.compiling import RECOMPILED_NOTE, Watch, compile_ms, eagerly, isolate
from attnbench.measure.cuda_graph import GraphCaptureError
from attnbench.measure.memory import MemoryUnavailable, peak_mem_mib
from attnbench.measure.profiling import cross_check_due, mismatch_note, profile_fn
from attnbench.measure.reference import magnitude, reference
from attnbench.measure.roofline import rates, roofline
from attnbench.measure.timing import TimerConfig, time_fn
from attnbench.registry import Impl, Unsupported
from attnbench.run.call import BadOutput, Call
from attnbench.run.inputs import Inputs, make_inputs
from attnbench.run.layer import layer_reference
from attnbench.store.rundir import RunDir
from attnbench.store.schema import COLUMNS

REASON_CHARS = 500  # a failed row's reason keeps about this much of its error
# a compiler's diagnostic line (gcc, clang, nvcc, ptxas: "file:line:col: error: ..."), which a
# compile error's message buries between the command line and pages of warnings
COMPILER_ERROR = re.compile(r"^.*\berror\b: .*$", re.MULTILINE)


@dataclass(frozen=True)
class Settings:
    """How rows are measured, beyond the case itself."""

    timer: TimerConfig = TimerConfig()
    matmul_tflops: dict = field(default_factory=dict)  # dtype -> measured ceiling (pct_peak)
    copy_gb_s: float | None = None  # the measured copy bandwidth (pct_peak of memory-bound rows)
    ceilings_contended: bool = False  # the ceilings waited for the CPU: no bound (roofline)
    profile: tuple[str, ...] | None = None  # None: off; (): every pair; else all must match
    traces_dir: Path | None = None  # where --profile writes one Chrome trace per pair
    malloc_tunables: bool = True  # CPU: keep the heap between timed calls (measure/allocator.py)

    def profiles(self, impl: Impl, case: Case) -> bool:
        text = f"{impl.name} {case.label()}"
        return self.profile is not None and all(part in text for part in self.profile)


class Measured(NamedTuple):
    row: dict
    times: list[float]  # the timing samples, ms
    kernels: list[dict]  # with --profile: the kernel (GPU) or op (CPU) table of the pair
    error: str | None = None  # the full error (traceback) when the reason had to cut it short


def base_row(impl: Impl, case: Case) -> dict:
    """The row's identity, every other column blank (``measure`` fills them for ok rows)."""
    row = {name: None for name in COLUMNS}
    row.update(case.as_dict(), impl=impl.name)
    return row


class Prepared:
    """A case's inputs and ground truth, shared by all its impls. ``build`` makes them (only
    when some impl will run, so a case no impl supports costs nothing); it is called before
    the first row, outside any row's timeout."""

    def __init__(self, case: Case, seed: int, settings: Settings):
        self.case, self.seed, self.settings = case, seed, settings
        self.inputs: Inputs | None = None
        self.truth: Truth | None = None

    def build(self) -> None:
        if self.inputs is None:
            self.inputs = make_inputs(self.case, self.seed)
            self.truth = ground_truth(self.case, self.inputs)

    def measure(self, impl: Impl) -> Measured:
        if not impl.reasons(self.case):
            self.build()
        return measure(impl, self.case, self.inputs, self.truth, self.settings)


def ground_truth(case: Case, inputs: Inputs) -> Truth:
    args = dict(
        causal=case.causal,
        scale=inputs.scale,
        dout=inputs.dout,
        window=case.window,
        kv_lens=inputs.mask.kv_lens,
    )
    if inputs.mask.pattern is not None:
        args["pattern"] = inputs.mask.pattern
    if inputs.mask.score_mod is not None:
        args["score_mod"] = inputs.mask.score_mod

    def truth(dtype):
        if case.level == "layer":
            return layer_reference(
                inputs.x,
                inputs.weights,
                heads=case.heads,
                kv_heads=case.kv_heads,
                dtype=dtype,
                **args,
            )
        return reference(inputs.q, inputs.k, inputs.v, dtype=dtype, shift=case.shift, **args)

    try:
        out, grads = truth(torch.float64)
        ref = [out, *(grads or ())]
        if case.level == "layer":  # the legacy rule: the magnitude is defined for the op only
            b_out, b_grads = truth(case.torch_dtype)
            got = [b_out, *(b_grads or ())]
            return Truth(ref, baseline=[agreement.legacy_error(x, r) for x, r in zip(got, ref)])
        mag = magnitude(inputs.q, inputs.k, inputs.v, shift=case.shift, **args)
        return Truth(ref, mag=mag)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        release(case)
        return Truth(
            None, failure=f"not checked: the float64 reference ran out of memory ({one_line(exc)})"
        )


def measure(
    impl: Impl, case: Case, inputs: Inputs | None, truth: Truth | None, settings: Settings
) -> Measured:
    """One row, the design's loop: check support, judge a checked call against the float64
    reference, compile time, backend, a timing pass (clocks sampled), a memory pass, and on
    CUDA (or with --profile) a profiled pass. A failure at any step leaves every metric
    blank."""
    reasons = impl.reasons(case) + (cuda_graph.reasons(case) if settings.timer.cuda_graph else [])
    if reasons:
        return failed(impl, case, "unsupported", "; ".join(reasons))
    row, notes, call = base_row(impl, case), [], None
    try:
        if impl.compiled:
            isolate(impl.name)
        call = Call.prepare(impl, case, inputs)
        with Watch() as first:
            (out, grads), first_ms = _once(call.check, case.device_type)
        eager = eagerly(call.check) if impl.compiled else None  # run only on a disagreement
        verdict = diagnose.judge(case, inputs, [out, *(grads or ())], truth, eager)
        del out, grads
        row.update(verdict.columns)
        notes.extend(verdict.notes)
        if impl.compiled:
            again_ms = lambda: _once(call.check, case.device_type)[1]  # noqa: E731
            row["compile_ms"] = compile_ms(first.compiled, first_ms, again_ms, notes)
        row["backend"] = _backend(impl, call, case)
        notes.extend(filter(None, [borrowed_note(impl.name, row["backend"])]))
        times = _time(impl, case, inputs, call, settings, row, notes)
        row["work_flops"] = work_flops(impl, case, call)
        row.update(roofline(row, case, settings, notes))
        row["peak_mem_mib"] = _memory(impl, case, call, notes)
        kernels = _profile(impl, case, call, settings, row, notes)
        row.update(status="ok", reason="; ".join(notes) or None)
        return Measured(row, times, kernels)
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        return caught(impl, case, exc)
    finally:
        call = None
        release(case)


def _time(
    impl: Impl, case: Case, inputs: Inputs, call: Call, settings: Settings, row, notes
) -> list[float]:
    """The timing pass, clocks sampled alongside: the row's time, clock, rate and
    recompiled columns and the pass's notes (measure/timing.py). Returns the samples, ms."""
    label = f"{impl.name} {case.label()} timing"
    with ClockSampler(case.device) as clocks, _nvtx(label), Watch() as timed:
        timing = time_fn(call.timed_fn(), case.device_type, settings.timer)
    row.update(clocks.summary(), recompiled=timed.compiled)
    if timed.compiled:
        notes.append(RECOMPILED_NOTE)
    notes.extend(timing.notes())
    kv_lens = None if inputs.mask.kv_lens is None else inputs.mask.kv_lens.tolist()
    flops = case.flops(kv_lens, inputs.mask.pattern)
    row.update(timing.columns(), cuda_graph=settings.timer.cuda_graph)
    row.update(rates(flops, case.bytes_moved(), timing.median_ms))
    return list(timing.samples_ms)


def _memory(impl: Impl, case: Case, call: Call, notes: list[str]) -> float | None:
    """The memory pass: peak_mem_mib, or blank with a note where it cannot be measured."""
    try:
        with _nvtx(f"{impl.name} {case.label()} memory"):
            return peak_mem_mib(call.memory_fn(), case.device_type)
    except MemoryUnavailable as exc:
        notes.append(f"peak_mem_mib not measured: {exc}")
        return None


def caught(impl: Impl, case: Case, exc: Exception) -> Measured:
    """The failed row for what a row's steps raised: unsupported (the impl or the CUDA-graph
    capture refused), a bad output, out of memory, or an error (its full text kept for the
    run's errors log when the reason cuts it short)."""
    if isinstance(exc, (Unsupported, GraphCaptureError)):
        return failed(impl, case, "unsupported", str(exc))
    if isinstance(exc, BadOutput):
        return failed(impl, case, "error", f"bad output: {exc}")
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _is_cpu_oom(exc):
        return failed(impl, case, "oom", _oom_reason(case, exc))
    reason, full = error_reason(exc)
    return failed(impl, case, "error", reason)._replace(error=full)


def work_flops(impl: Impl, case: Case, call: Call) -> float | None:
    """FLOPs of the pairs the impl's computation covers, masked ones included, as its ``work``
    declares them (level op only: the layer's projections are not declared)."""
    if impl.work is None or case.level != "op":
        return None
    pairs = impl.work(case, call.mask)
    if pairs is None:
        return None
    return 4.0 * case.heads * case.head_dim * pairs * MODE_FLOP_FACTOR[case.mode]


def _once(fn, device_type: str) -> tuple[object, float]:
    """One call's result and wall time in ms, the device's queue drained before and after."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device_type == "cuda":
        torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3


def _backend(impl: Impl, call: Call, case: Case) -> str | None:
    """The SDPA backend the timed work runs: detected on that work itself, in its grad mode
    (PyTorch picks backends differently for training), backward kernels included."""
    if not callable(impl.backend):
        return impl.backend
    return impl.backend(call.memory_fn(), case.device_type)


def _profile(
    impl: Impl, case: Case, call: Call, settings: Settings, row: dict, notes: list[str]
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
    with _nvtx(f"{impl.name} {case.label()} profile"):
        prof = profile_fn(call.timed_fn(), case.device_type, trace_path=trace)
    row["profiler_ms"] = prof.device_ms_per_call
    note = mismatch_note(row["time_ms"], prof.device_ms_per_call)
    if note:
        notes.append(note)
    return prof.kernels if wanted else []


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _nvtx(name: str):
    """An NVTX range (seen by nsys / ncu) when CUDA is up; nothing otherwise."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


def failed(impl: Impl, case: Case, status: str, reason: str) -> Measured:
    return Measured({**base_row(impl, case), "status": status, "reason": reason}, [], [])


def _is_cpu_oom(exc: Exception) -> bool:
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _oom_reason(case: Case, exc: BaseException) -> str:
    return (
        f"out of memory at B={case.batch} Hq={case.heads} seq_q={case.seq_q} "
        f"seq_kv={case.seq_kv} D={case.head_dim} {case.dtype}: {one_line(exc)}"
    )


def error_reason(exc: BaseException) -> tuple[str, str | None]:
    """A failed row's reason, one line: the error's type and message, and when that is longer
    than REASON_CHARS its start and its end, or instead of the end a compiler's first error
    line (after its command line, before its warnings), naming the run's errors log; then
    also the full error with its traceback, for the log."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(text) <= REASON_CHARS:
        return text, None
    half = REASON_CHARS // 2
    diagnostic = COMPILER_ERROR.search(str(exc))  # the compiler's first error, if any
    end = " ".join(diagnostic.group(0).split())[:half] if diagnostic else text[-half:]
    short = (
        f"{text[:half]} [...] {end} (cut short: the full error is in {RunDir.ERRORS} "
        f"in the run folder)"
    )
    return short, "".join(traceback.format_exception(exc))


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + ("..." if len(text) > 500 else "")


def release(case: Case) -> None:
    gc.collect()
    if case.device_type == "cuda":
        torch.cuda.empty_cache()
