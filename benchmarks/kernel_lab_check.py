"""The kernel lab's check and timer: the float64 truth of a case (out, LSE, the grads), the
verdict on one variant's output, and one row's time (benchmarks/kernel_lab.py)."""

from __future__ import annotations

import time


class Truth:
    """The float64 reference of one case: out, LSE, and the grads for ``dout``."""

    def __init__(self, case, inputs, dout):
        from attnbench.measure.reference import magnitude, reference

        q, k, v = inputs.q, inputs.k, inputs.v
        args = dict(causal=case.causal, scale=inputs.scale)
        out, grads = reference(q, k, v, **args, dout=dout)
        self.ref = {"out": out, **dict(zip(("dq", "dk", "dv"), grads or ()))}
        mags = magnitude(q, k, v, **args, dout=dout)
        self.mag = dict(zip(("out", "dq", "dk", "dv"), mags))
        self.lse = lse_reference(q, k, inputs.scale, case.causal)


def lse_reference(q, k, scale: float, causal: bool, rows: int = 1024):
    """log-sum-exp of the scaled scores per query row, float64, ``rows`` query rows at a time:
    (B, Hq, Sq). Top-left causal: query i sees keys j <= i."""
    import torch

    kk = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, Hq, Skv, D)
    parts = []
    for i0 in range(0, q.shape[2], rows):
        s = q[:, :, i0 : i0 + rows].double() @ kk.transpose(-1, -2) * scale
        if causal:
            i = torch.arange(i0, i0 + s.shape[2], device=q.device)[:, None]
            j = torch.arange(k.shape[2], device=q.device)[None, :]
            s = s.masked_fill(j > i, float("-inf"))
        parts.append(s.logsumexp(-1))
    return torch.cat(parts, dim=2)


def check(kind: str, got, truth: Truth, dtype) -> list[str]:
    """Disagreements of one variant's call with the reference; [] when it agrees."""
    from attnbench.measure.agreement import rule, unit_roundoff

    names = ["out"] if kind == "fwd" else ["dq", "dk", "dv"]
    tensors = [got[0]] if kind == "fwd" else list(got)
    verdict = rule(names, tensors, [truth.ref[n] for n in names],
                   [truth.mag[n] for n in names], dtype)  # fmt: skip
    bad = [] if verdict.agrees else list(verdict.notes)
    if kind == "fwd":
        lse, ref = got[1].detach().double(), truth.lse
        seen = ref.isfinite()
        err = float((lse[seen] - ref[seen]).abs().max()) if seen.any() else 0.0
        if err > unit_roundoff(dtype) or not bool((lse[~seen] == ref[~seen]).all()):
            bad.append(f"lse max-abs {err:.3g} > {unit_roundoff(dtype):.3g}")
    return bad


def timed(fn, case, rep_ms: float, kind: str) -> dict:
    """The row's time: the harness's timer (median) on a GPU, with the median SM clock while it
    ran (NVML; the rows of one call run at whatever clocks the power cap leaves them); on the
    CPU (dry run) one call's wall time."""
    from attnbench.measure.clocks import ClockSampler, summarize
    from attnbench.measure.timing import TimerConfig, time_fn

    with ClockSampler(case.device) as clocks:
        if case.device == "cpu":
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        else:
            ms = time_fn(fn, "cuda", TimerConfig(rep_ms=rep_ms)).median_ms
    mhz = summarize(clocks.samples)["sm_clock_mhz"]
    return dict(status="ok", time_ms=ms, tflops=_flops(case, kind) / ms / 1e9, sm_mhz=mhz)


def _flops(case, kind: str) -> float:
    from dataclasses import replace

    return replace(case, mode="fwd" if kind == "fwd" else "bwd").flops()
