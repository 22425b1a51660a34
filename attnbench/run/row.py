"""One case and one row: inputs and the float64 reference once per case; per impl a checked
call, accuracy, compile time, backend, a timing pass, a memory pass and a profiled pass. A
failure at any step is a row with a status and a reason and every metric blank."""

from __future__ import annotations

import contextlib
import gc
import math
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from attnbench.case import MODE_FLOP_FACTOR, Case
from attnbench.impls.xformers_kernels import borrowed_note
from attnbench.measure import accuracy
from attnbench.measure.clocks import ClockSampler
from attnbench.measure.compiling import compile_events, isolate
from attnbench.measure.cuda_graph import GraphCaptureError
from attnbench.measure.memory import MemoryUnavailable, peak_mem_mib
from attnbench.measure.profiling import cross_check_due, mismatch_note, profile_fn
from attnbench.measure.timing import NOISY_SPREAD, PAGE_FAULTS_FLAG, TimerConfig, time_fn
from attnbench.registry import Impl, Unsupported
from attnbench.run.call import BadOutput, Call
from attnbench.run.inputs import Inputs, make_inputs
from attnbench.run.layer import layer_reference
from attnbench.store.rundir import RunDir
from attnbench.store.schema import COLUMNS

REASON_CHARS = 500  # a failed row's reason keeps about this much of its error
# bound: an intensity within this factor of the ridge point is "balanced" (docs/method.md)
RIDGE_BAND = 2.0


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


@dataclass
class Truth:
    """Per case: the float64 reference and what its agreement rule needs (docs/method.md):
    at level op the float64 magnitudes, at level layer the legacy rule's baseline (the
    textbook formula's error in the case dtype)."""

    ref: list[torch.Tensor] | None  # out (+ its grads), canonical layout, float64
    mag: list[accuracy.Magnitude] | None = None  # level op: accuracy.magnitude, as ref
    baseline: list[accuracy.LegacyError] | None = None  # level layer only
    failure: str | None = None


def checked_names(case: Case) -> list[str]:
    """The tensors compared with the reference, in Call.check's order."""
    grads = ["dq", "dk", "dv"] if case.level == "op" else ["dx", "dwq", "dwk", "dwv", "dwo"]
    return ["out", *(grads if case.backward else [])]


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
        return accuracy.reference(
            inputs.q, inputs.k, inputs.v, dtype=dtype, shift=case.shift, **args
        )

    try:
        out, grads = truth(torch.float64)
        ref = [out, *(grads or ())]
        if case.level == "layer":  # the legacy rule: the magnitude is defined for the op only
            b_out, b_grads = truth(case.torch_dtype)
            got = [b_out, *(b_grads or ())]
            return Truth(ref, baseline=[accuracy.legacy_error(x, r) for x, r in zip(got, ref)])
        mag = accuracy.magnitude(inputs.q, inputs.k, inputs.v, shift=case.shift, **args)
        return Truth(ref, mag=mag)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        release(case)
        return Truth(
            None, failure=f"not checked: the float64 reference ran out of memory ({one_line(exc)})"
        )


def measure(
    impl: Impl, case: Case, inputs: Inputs | None, truth: Truth | None, settings: Settings
) -> Measured:
    """One row: support check, a checked run, a timing pass (clocks sampled), a memory pass,
    and on CUDA (or with --profile) a profiled pass. A failure at any step leaves every metric
    blank."""
    row = base_row(impl, case)
    reasons = impl.reasons(case)
    if settings.timer.cuda_graph and case.backward:
        reasons.append(
            f"mode={case.mode} with --cuda-graph (supported: fwd; a backward is not captured)"
        )
    if reasons:
        return failed(impl, case, "unsupported", "; ".join(reasons))
    notes = []
    try:
        if impl.compiled:
            isolate(impl.name)
        call = Call.prepare(impl, case, inputs)
        compiles = compile_events()
        (out, grads), first_ms = _once(call.check, case.device_type)
        compiled_now = compile_events() != compiles
        row.update(_accuracy(case, [out, *(grads or ())], truth, notes))
        del out, grads
        if impl.compiled and compiled_now:  # the first call's extra time is compilation
            row["compile_ms"] = first_ms - _once(call.check, case.device_type)[1]
        elif impl.compiled:
            row["compile_ms"] = 0.0
            notes.append(
                "compile_ms 0: the first call compiled nothing (it reused code it "
                "compiled for an earlier row)"
            )
        row["backend"] = _backend(impl, call, case)
        notes.extend(filter(None, [borrowed_note(impl.name, row["backend"])]))
        compiles = compile_events()
        with ClockSampler(case.device) as clocks, _nvtx(f"{impl.name} {case.label()} timing"):
            timing = time_fn(call.timed_fn(), case.device_type, settings.timer)
        row.update(clocks.summary())
        row["recompiled"] = compile_events() != compiles
        if row["recompiled"]:
            notes.append("recompiled during the timing pass: time_ms includes compilation")
        times = list(timing.samples_ms)
        if timing.spread > NOISY_SPREAD:
            notes.append(
                f"noisy: the p20-p80 spread of the samples is {100 * timing.spread:.0f}% of "
                f"the median (over {100 * NOISY_SPREAD:.0f}%), so time_ms may move between "
                f"identical runs; another process may be using the device"
            )
        if timing.page_faults is not None:
            row["page_faults"] = timing.page_faults
            if timing.page_faults >= PAGE_FAULTS_FLAG:
                notes.append(
                    f"page faults inside the timing: {timing.page_faults:.0f} per call; "
                    f"timed calls paged memory in (the heap grew, or the allocator handed "
                    f"memory back to the OS between calls), so time_ms includes it and may "
                    f"move between identical runs"
                )
        if timing.contention is not None:
            row["cpu_share"] = timing.contention.cpu_share
            row["contended"] = timing.contention.contended
            if row["contended"]:
                notes.append(timing.contention.note())
        flops = case.flops(
            None if inputs.mask.kv_lens is None else inputs.mask.kv_lens.tolist(),
            inputs.mask.pattern,
        )
        seconds = timing.median_ms * 1e-3
        row.update(
            time_ms=timing.median_ms,
            time_ms_p20=timing.p20_ms,
            time_ms_p80=timing.p80_ms,
            samples=len(times),
            cuda_graph=settings.timer.cuda_graph,
            flops=flops,
            tflops=flops / seconds / 1e12,
            gbps=case.bytes_moved() / seconds / 1e9,
        )
        row["work_flops"] = work_flops(impl, case, call)
        row.update(roofline(row, case, settings, notes))
        try:
            with _nvtx(f"{impl.name} {case.label()} memory"):
                row["peak_mem_mib"] = peak_mem_mib(call.memory_fn(), case.device_type)
        except MemoryUnavailable as exc:
            notes.append(f"peak_mem_mib not measured: {exc}")
        kernels = _profile(impl, case, call, settings, row, notes)
        row.update(status="ok", reason="; ".join(notes) or None)
        return Measured(row, times, kernels)
    except (Unsupported, GraphCaptureError) as exc:
        return failed(impl, case, "unsupported", str(exc))
    except BadOutput as exc:
        return failed(impl, case, "error", f"bad output: {exc}")
    except (torch.OutOfMemoryError, MemoryError) as exc:
        return failed(impl, case, "oom", _oom_reason(case, exc))
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        if _is_cpu_oom(exc):
            return failed(impl, case, "oom", _oom_reason(case, exc))
        reason, full = error_reason(exc)
        return failed(impl, case, "error", reason)._replace(error=full)
    finally:
        call = None
        release(case)


def roofline(row: dict, case: Case, settings: Settings, notes: list[str]) -> dict:
    """pct_peak and bound: the row against the roof its arithmetic intensity meets. The roof
    is min(matmul rate, intensity x copy bandwidth), so the percentage of it is the larger of
    tflops / matmul rate and gbps / copy bandwidth (whichever ceilings were measured).

    ``bound`` names a roof only where the intensity is RIDGE_BAND or more away from the ridge
    point (matmul rate / bandwidth): a ceiling measured up to that factor off cannot flip the
    label. Within the band it is ``balanced``; with ceilings measured while the process waited
    for the CPU (``ceilings_contended``, any factor off) it is blank."""
    peak_tflops = settings.matmul_tflops.get(case.dtype)
    shares = {
        "compute": row["tflops"] / peak_tflops if peak_tflops else None,
        "memory": row["gbps"] / settings.copy_gb_s if settings.copy_gb_s else None,
    }
    measured = {k: v for k, v in shares.items() if v is not None}
    if not measured:
        return {}
    out = {"pct_peak": 100 * max(measured.values())}
    if len(measured) == 2 and not settings.ceilings_contended:
        ridge = peak_tflops * 1e12 / (settings.copy_gb_s * 1e9)  # FLOP per byte
        intensity = row["flops"] / case.bytes_moved()
        out["bound"] = "balanced"
        if intensity * RIDGE_BAND <= ridge:
            out["bound"] = "memory"
        elif intensity >= ridge * RIDGE_BAND:
            out["bound"] = "compute"
    if out["pct_peak"] > 100:
        notes.append(
            f"pct_peak {out['pct_peak']:.0f}% is above the measured ceilings: they were "
            f"measured low (a busy machine?), so pct_peak is not trustworthy for this run"
        )
    return out


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


def _accuracy(case: Case, got: list[torch.Tensor], truth: Truth, notes: list[str]) -> dict:
    """The row's accuracy columns by the rule of docs/method.md; ``notes`` gets the reason of a
    disagreement (tensor, criterion, numbers) and of a blank rel_err."""
    if truth.failure:
        notes.append(truth.failure)
        return {}
    if truth.baseline is not None:
        return _legacy_accuracy(case, got, truth, notes)
    verdict = accuracy.judge(checked_names(case), got, truth.ref, truth.mag, case.torch_dtype)
    notes.extend(verdict.notes)
    return verdict.columns


def _share(err: float, bound: float) -> float:
    """err / bound, where a zero bound holds only a zero error."""
    if bound > 0:
        return err / bound
    return 0.0 if err == 0 else math.inf


def _legacy_accuracy(case: Case, got: list[torch.Tensor], truth: Truth, notes: list[str]) -> dict:
    """Level layer: the legacy rule (docs/method.md), within 2x the error of the textbook
    formula in the case dtype plus a floor."""
    names, dt = checked_names(case), case.torch_dtype
    errs = [accuracy.legacy_error(x, r) for x, r in zip(got, truth.ref)]
    bad = [n for n, e in zip(names, errs) if not e.finite]
    if bad:
        notes.append(
            "disagrees with the float64 reference: "
            + "; ".join(f"{n} non-finite (NaN/Inf)" for n in bad)
        )
        return {"agrees": False}
    bounds = [accuracy.legacy_bound(b, dt) for b in truth.baseline]
    zero = [not bool(r.any()) for r in truth.ref]  # rel_err is not defined for these
    wrong = []
    for n, e, (rel_b, abs_b), z in zip(names, errs, bounds, zero):
        if z:
            notes.append(f"{n}: the reference is exactly zero, so rel_err is not defined")
        elif e.rel > rel_b:
            wrong.append(f"{n} rel {e.rel:.3g} > {rel_b:.3g}")
        if e.max_abs > abs_b:
            wrong.append(f"{n} max-abs {e.max_abs:.3g} > {abs_b:.3g}")
    if wrong:
        notes.append("disagrees with the float64 reference (legacy rule): " + "; ".join(wrong))
    with_rel = [k for k in range(len(errs)) if not zero[k]]
    i = max(with_rel, key=lambda k: errs[k].rel / bounds[k][0], default=None)
    j = max(range(len(errs)), key=lambda k: _share(errs[k].max_abs, bounds[k][1]))
    return {
        "max_abs_err": errs[j].max_abs,
        "max_abs_bound": bounds[j][1],
        "rel_err": None if i is None else errs[i].rel,
        "err_bound": None if i is None else bounds[i][0],
        "agrees": not wrong,
    }


def error_reason(exc: BaseException) -> tuple[str, str | None]:
    """A failed row's reason, one line: the error's type and message, and when that is longer
    than REASON_CHARS its start and its end (where compilers print the error, after their
    command line) naming the run's errors log; then also the full error with its traceback,
    for the log."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(text) <= REASON_CHARS:
        return text, None
    half = REASON_CHARS // 2
    short = (
        f"{text[:half]} [...] {text[-half:]} (cut short: the full error is in {RunDir.ERRORS} "
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
