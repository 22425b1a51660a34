"""The precision figure of a low-precision row: its error next to what a correct kernel of
its dtype gets on the same inputs (docs/method.md, "Precision"). The pass/fail verdict
(measure/agreement.py) allows the rounding of any correct computation; a kernel that keeps
its running output in the half type stays inside that bound on short rows and is still
wrong for training. This figure compares the row with a kernel that accumulates in float32:
an emulation with the case's inputs, float32 scores, softmax and sums, the probabilities
rounded to the case dtype as flash kernels round them before P V, and its output written in
the case dtype; computed once per case beside the float64 reference.
"""

from __future__ import annotations

import math

import torch

from attnbench.measure.reference import reference

LOW_PRECISION = (torch.bfloat16, torch.float16)  # the dtypes a row gets the figure in
# Flagged above this (calibrated: scripts/calibrate_accuracy.py, docs/accuracy_calibration.md)
PRECISION_LIMIT = 2.75
OWN_SHARE = 0.25  # the elements compared: |ref| >= OWN_SHARE * magnitude
FLAG = "precision below an fp32-accumulating kernel"


def emulated(q, k, v, *, causal: bool, scale: float, mask=None) -> torch.Tensor | None:
    """out of the float32-accumulating kernel on the case's inputs q, k, v (B, H, S, D), in
    their dtype; None where the dtype is not a low-precision one, or with a score modifier
    (correct kernels round a modifier's bias differently: SDPA takes it in q's dtype, flex
    computes it in float32; that rounding, not the accumulator's, would set the figure)."""
    if q.dtype not in LOW_PRECISION or (mask is not None and mask.score_mod is not None):
        return None
    out, _ = reference(
        q, k, v, causal=causal, scale=scale, dtype=torch.float32, mask=mask, rounded_p=q.dtype
    )
    return out.to(q.dtype)


def precision_ratio(
    out: torch.Tensor, ref: torch.Tensor, fp32_acc: torch.Tensor, m: torch.Tensor
) -> float:
    """The figure: the largest error relative to the magnitude ``m`` (measure/reference.py)
    among the elements whose output is at least OWN_SHARE of their magnitude, over the same of
    the float32-accumulating kernel (1: as precise as it; every element where none is).

    Those elements are where an accumulator's rounding shows: a half-type accumulator rounds
    the running output itself, so its error grows with the output and with the number of key
    tiles, while a correct kernel's error there is its output's final rounding; the textbook
    formula in bfloat16 rounds its scores, an error spread over the elements whose terms
    cancel (small outputs), and so stays near the kernel's here though its norm error is
    twice it."""
    m = m.double()
    ref64 = ref.double()
    seen = m > 0  # a query that sees no key: out, m and the error are all zero
    own = seen & (ref64.abs() >= OWN_SHARE * m)
    if not own.any():
        own = seen
    if not own.any():
        return 1.0
    err = (out.double() - ref64).abs() / m
    base = (fp32_acc.double() - ref64).abs() / m
    worst, kernel = err[own].max().item(), base[own].max().item()
    if kernel == 0:
        return 1.0 if worst == 0 else math.inf
    return worst / kernel


def judged(out: torch.Tensor, ref: torch.Tensor, fp32_acc: torch.Tensor | None, m: torch.Tensor):
    """The row's precision columns and its note: ({precision_ratio, precision_low}, note or
    None); no columns without an emulation (float32 rows, level layer)."""
    if fp32_acc is None or not torch.isfinite(out).all():  # non-finite: the verdict says it
        return {}, None
    ratio = precision_ratio(out, ref, fp32_acc, m)
    low = ratio > PRECISION_LIMIT
    note = (
        f"{FLAG}: out's largest error where the output dominates its magnitude is {ratio:.3g}x "
        f"that kernel's on the same inputs (limit {PRECISION_LIMIT:g}x: a half-type "
        f"accumulator?)"
        if low
        else None
    )
    return {"precision_ratio": ratio, "precision_low": low}, note
