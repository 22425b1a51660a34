"""One case and one row: inputs and the float64 reference once per case (``Prepared``); per
impl the design's steps, which the worker (run/executing/worker.py) drives over a case's impls:
``check`` (a checked call, accuracy, compile time, backend), ``time_round`` (its part of each timing
round) and ``finish`` (the timing columns, a memory pass and a profiled pass:
run/measuring/passes.py). A failure at any step is a row with a status and a reason and every
metric blank (run/measuring/failed.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from attnbench.case import MODE_FLOP_FACTOR, Case
from attnbench.measure import cuda_graph, diagnose
from attnbench.measure.agreement import Truth
from attnbench.measure.backends import borrowed_note
from attnbench.measure.clocks import ClockSampler, summarize
from attnbench.measure.compiling import RECOMPILED_NOTE, Watch, compile_ms, eagerly, isolate
from attnbench.measure.paired import ratio, round_medians
from attnbench.measure.precision import emulated
from attnbench.measure.reference import magnitude, reference
from attnbench.measure.roofline import rates, roofline
from attnbench.measure.timing import RoundTimer, Slice, TimerConfig, Timing, interleaved
from attnbench.registry import Impl
from attnbench.run.measuring import heap
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.failed import Measured, base_row, caught, failed_row, one_line
from attnbench.run.measuring.inputs import Inputs, make_inputs
from attnbench.run.measuring.layer import Parts, layer_truth
from attnbench.run.measuring.passes import (
    InRound,
    memory,
    nvtx,
    profile,
    profile_due,
    profile_in_round,
)


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

    def with_ceilings(self, ceilings: dict) -> Settings:
        """These settings reading pct_peak and bound against the measured ``ceilings``."""
        return replace(
            self,
            matmul_tflops=ceilings["matmul_tflops"],
            copy_gb_s=ceilings["copy_gb_s"],
            ceilings_contended=ceilings.get("contended", False),
        )

    def profiles(self, impl: Impl, case: Case) -> bool:
        text = f"{impl.name} {case.label()}"
        return self.profile is not None and all(part in text for part in self.profile)


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


def ground_truth(case: Case, inputs: Inputs, parts: Parts | None = None) -> Truth:
    """The case's float64 reference and what its rule needs; at level layer of the layer with
    ``parts`` (run/measuring/layer.py; None: the plain block)."""
    args = dict(causal=case.causal, scale=inputs.scale, dout=inputs.dout, mask=inputs.mask)
    try:
        if case.level == "layer":  # the legacy rule: the magnitude is defined for the op only
            return layer_truth(case, inputs, parts, **args)
        out, grads = reference(inputs.q, inputs.k, inputs.v, dtype=torch.float64, **args)
        mag = magnitude(inputs.q, inputs.k, inputs.v, **args)
        kernel = dict(causal=case.causal, scale=inputs.scale, mask=inputs.mask)
        fp32_acc = emulated(inputs.q, inputs.k, inputs.v, **kernel)
        return Truth([out, *(grads or ())], mag=mag, fp32_acc=fp32_acc)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        release(case)
        return Truth(
            None, failure=f"not checked: the float64 reference ran out of memory ({one_line(exc)})"
        )


@dataclass
class Checked:
    """An impl whose call passed its check on a case: the call, the row so far and its
    notes, and the timer of its rounds."""

    impl: Impl
    case: Case
    inputs: Inputs
    call: Call
    row: dict
    notes: list[str]
    timer: RoundTimer
    settings: Settings
    profile_due: bool = False  # a profiled pass, in the last timing round
    in_round: InRound | None = None  # that pass, once taken


def check(
    impl: Impl, case: Case, inputs: Inputs | None, truth: Truth | None, settings: Settings
) -> Checked | Measured:
    """The design's check phase: support, a checked call judged against the float64
    reference (diagnosed on disagreement), compile time, backend; the impl's row if it
    failed, else what its timing rounds need."""
    reasons = support_reasons(impl, case, settings)
    if reasons:
        return failed_row(impl, case, "unsupported", "; ".join(reasons))
    row, notes = base_row(impl, case), []
    try:
        if impl.compiled:
            isolate(impl.name)
        call = Call.prepare(impl, case, inputs)
        if call.parts is not None:  # a layer beyond the plain block: its own reference
            truth = ground_truth(case, inputs, call.parts)
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
        notes.extend(filter(None, [borrowed_note(impl.name, row["backend"]), call.path_note()]))
        timer = RoundTimer(call.timed_fn(), case.device_type, settings.timer)
        due = profile_due(impl, case, settings)
        return Checked(impl, case, inputs, call, row, notes, timer, settings, due)
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        return caught(impl, case, exc)


def time_round(checked: Checked, index: int) -> Slice | Measured:
    """The impl's part of timing round ``index``: a short warm-up, then its samples, clocks
    sampled and compiles watched alongside; in the last round of a profiled row, then its
    profiled calls (run/measuring/passes.py: at the same clocks); its failed row if it raised."""
    impl, case = checked.impl, checked.case
    try:
        checked.timer.warm_up()  # a recompile here is not timed, so not flagged
        label = f"{impl.name} {case.label()} timing"
        with ClockSampler(case.device) as clocks, nvtx(label), Watch() as timed:
            part = checked.timer.samples(index)
        if checked.profile_due and index == checked.settings.timer.rounds - 1:
            checked.in_round = profile_in_round(impl, case, checked.call, checked.settings)
        return replace(part, clocks=tuple(clocks.samples), recompiled=timed.compiled)
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        return caught(impl, case, exc)


def time_together(group: list[Checked], index: int) -> dict[str, Slice | Measured]:
    """CPU: the impls' parts of timing round ``index`` taken in turns, sample by sample
    (measure/timing.py ``interleaved``), after each one's short warm-up; in the last round,
    then each profiled row's profiled calls; impl name -> its slice, or its failed row if it
    raised."""
    answers: dict[str, Slice | Measured] = {}
    timers = {}
    for checked in group:
        try:
            checked.timer.warm_up()
            timers[checked.impl.name] = checked.timer
        except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
            answers[checked.impl.name] = caught(checked.impl, checked.case, exc)
    by_name = {c.impl.name: c for c in group}

    def failed_row(name, exc):
        answers[name] = caught(by_name[name].impl, by_name[name].case, exc)

    with ClockSampler(group[0].case.device) as clocks, Watch() as timed:
        slices = interleaved(timers, index, failed_row)
    for name, part in slices.items():
        answers[name] = replace(part, clocks=tuple(clocks.samples), recompiled=timed.compiled)
        checked = by_name[name]
        if checked.profile_due and index == checked.settings.timer.rounds - 1:
            try:  # its profiled calls right after the round, as time_round takes them
                checked.in_round = profile_in_round(
                    checked.impl, checked.case, checked.call, checked.settings
                )
            except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
                answers[name] = caught(checked.impl, checked.case, exc)
    return answers


def finish(
    checked: Checked, slices: list[Slice], settings: Settings, base: dict | None = None
) -> Measured:
    """The row from its timing rounds (time, clock, rate and recompiled columns and their
    notes: measure/timing.py), then a memory pass, and on CUDA (or with --profile) a profiled
    pass; with the baseline's median per round (``base``), its speedup over the baseline,
    paired by round (measure/paired.py). A failure at any step leaves every metric blank."""
    impl, case, inputs, call = checked.impl, checked.case, checked.inputs, checked.call
    row, notes = checked.row, checked.notes
    try:
        timing = Timing.from_slices(slices)
        row.update(summarize([c for s in slices for c in s.clocks]))
        row["recompiled"] = any(s.recompiled for s in slices)
        if row["recompiled"]:
            notes.append(RECOMPILED_NOTE)
        notes.extend(timing.notes())
        flops = case.flops(inputs.mask.layout)
        row.update(timing.columns(), cuda_graph=settings.timer.cuda_graph)
        row.update(_speedup(base, timing))
        row.update(rates(flops, case.bytes_moved(), timing.median_ms))
        row["work_flops"] = work_flops(impl, case, call)
        row.update(roofline(row, case, settings, notes))
        row["peak_mem_mib"] = memory(impl, case, call, notes)
        profiled, kernels = profile(impl, case, settings, row, notes, checked.in_round)
        row.update(profiled)
        row.update(status="ok", reason="; ".join(notes) or None)
        return Measured(row, list(timing.samples_ms), kernels, rounds=timing.rounds)
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        return caught(impl, case, exc)


def _speedup(base: dict | None, timing: Timing) -> dict:
    """The speedup columns over the baseline's medians per round, where both have rounds."""
    speedup = None if base is None else ratio(base, round_medians(timing.samples_ms, timing.rounds))
    if speedup is None:
        return {}
    return dict(speedup=speedup.value, speedup_lo=speedup.lo, speedup_hi=speedup.hi)


def support_reasons(impl: Impl, case: Case, settings: Settings) -> list[str]:
    """Why ``impl`` cannot run ``case`` with these settings ([] when it can)."""
    return impl.reasons(case) + (cuda_graph.reasons(case) if settings.timer.cuda_graph else [])


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


def release(case: Case) -> None:
    heap.collect()
    if case.device_type == "cuda":
        torch.cuda.empty_cache()
