"""The sweep: cases x impls -> one durable row each. Read top-down."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from attnbench import accuracy
from attnbench.case import Case
from attnbench.inputs import Inputs, make_inputs
from attnbench.memory import MemoryUnavailable, peak_mem_mib
from attnbench.registry import Impl, Unsupported
from attnbench.results import COLUMNS, row_writer, samples_writer
from attnbench.runner import BadOutput, Call
from attnbench.timing import TimerConfig, time_fn


@dataclass
class Truth:
    """Per case: the float64 reference and the textbook formula's error in the case dtype."""
    ref: list[torch.Tensor] | None  # out (+ dq, dk, dv), canonical layout, float64
    baseline: list[accuracy.Error] | None
    failure: str | None = None


def run_sweep(cases: list[Case], impls: list[Impl], run_dir: Path, *, run_id: str, seed: int,
              timer: TimerConfig = TimerConfig(), progress: bool = True) -> list[dict]:
    """Run every (case, impl); append each row to run_dir/results.csv as soon as it exists."""
    rows = []
    bar = tqdm(total=len(cases) * len(impls), disable=not progress, unit="row",
               dynamic_ncols=True)
    with row_writer(run_dir) as out, samples_writer(run_dir) as samples:
        for case in cases:
            inputs = make_inputs(case, seed)
            truth = ground_truth(case, inputs)
            for impl in impls:
                bar.set_postfix_str(f"{impl.name}: {case.label()}", refresh=False)
                row, times = measure(impl, case, inputs, truth, timer)
                row.update(run_id=run_id, seed=seed)
                out.write(row)
                samples.write([{**row, "sample": i, "time_ms": t} for i, t in enumerate(times)])
                rows.append(row)
                bar.update()
            del inputs, truth
            _release(case)
    bar.close()
    return rows


def ground_truth(case: Case, inputs: Inputs) -> Truth:
    args = dict(causal=case.causal, scale=inputs.scale, dout=inputs.dout)
    try:
        out, grads = accuracy.reference(inputs.q, inputs.k, inputs.v, **args)
        ref = [out, *(grads or ())]
        b_out, b_grads = accuracy.reference(inputs.q, inputs.k, inputs.v, dtype=case.torch_dtype,
                                            **args)
        baseline = [accuracy.error(x, r) for x, r in zip([b_out, *(b_grads or ())], ref)]
    except torch.OutOfMemoryError as exc:
        _release(case)
        return Truth(None, None, f"not checked: the float64 reference ran out of memory ({exc})")
    return Truth(ref, baseline)


def base_row(impl: Impl, case: Case) -> dict:
    row = {name: None for name in COLUMNS}
    row.update(case.as_dict(), impl=impl.name, flops=case.flops())
    return row


def measure(impl: Impl, case: Case, inputs: Inputs, truth: Truth,
            timer: TimerConfig) -> tuple[dict, list[float]]:
    """One row: support check, a checked run, a timing pass, a memory pass. A failure at any
    step leaves every metric blank."""
    row = base_row(impl, case)
    reasons = impl.reasons(case)
    if reasons:
        return {**row, "status": "unsupported", "reason": "; ".join(reasons)}, []
    notes, times = [], []
    try:
        call = Call.prepare(impl, case, inputs)
        out, grads = call.check()
        row.update(_accuracy(case, [out, *(grads or ())], truth, notes))
        del out, grads
        timing = time_fn(call.timed_fn(), case.device_type, timer)
        times = list(timing.samples_ms)
        row.update(time_ms=timing.median_ms, time_ms_p20=timing.p20_ms,
                   time_ms_p80=timing.p80_ms, samples=len(times),
                   tflops=case.flops() / (timing.median_ms * 1e-3) / 1e12)
        try:
            row["peak_mem_mib"] = peak_mem_mib(call.memory_fn(), case.device_type)
        except MemoryUnavailable as exc:
            notes.append(f"peak_mem_mib not measured: {exc}")
        row.update(status="ok", reason="; ".join(notes) or None)
        return row, times
    except Unsupported as exc:
        return {**base_row(impl, case), "status": "unsupported", "reason": str(exc)}, []
    except torch.OutOfMemoryError as exc:
        return {**base_row(impl, case), "status": "oom", "reason": _one_line(exc)}, []
    except BadOutput as exc:
        return {**base_row(impl, case), "status": "error", "reason": f"bad output: {exc}"}, []
    except Exception as exc:  # noqa: BLE001 - an impl's failure is a row, never a crash
        return {**base_row(impl, case), "status": "error",
                "reason": f"{type(exc).__name__}: {_one_line(exc)}"}, []
    finally:
        call = None
        _release(case)


def _accuracy(case: Case, got: list[torch.Tensor], truth: Truth, notes: list[str]) -> dict:
    if truth.failure:
        notes.append(truth.failure)
        return {}
    names = ["out", "dq", "dk", "dv"]
    errs = [accuracy.error(x, r) for x, r in zip(got, truth.ref)]
    bad = [n for n, e in zip(names, errs) if not e.finite]
    if bad:
        notes.append(f"non-finite values (NaN/Inf) in {', '.join(bad)}")
        return {"agrees": False}
    wrong = [n for n, e, b in zip(names, errs, truth.baseline)
             if not accuracy.agrees(e, b, case.torch_dtype)]
    if wrong:
        notes.append(f"disagrees with the float64 reference in {', '.join(wrong)}")
    # the tensor nearest to (or furthest past) its rel bound speaks for the row
    bounds = [accuracy.bound(b, case.torch_dtype)[0] for b in truth.baseline]
    worst = max(range(len(errs)), key=lambda i: errs[i].rel / bounds[i])
    return {"max_abs_err": max(e.max_abs for e in errs), "rel_err": errs[worst].rel,
            "err_bound": bounds[worst], "agrees": not wrong}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + ("..." if len(text) > 500 else "")


def _release(case: Case) -> None:
    gc.collect()
    if case.device_type == "cuda":
        torch.cuda.empty_cache()
