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
from typing import TYPE_CHECKING

from attnbench.case import torch_dtype

if TYPE_CHECKING:
    import torch

LOW_PRECISION = ("bfloat16", "float16")  # the dtypes a row gets the figure in
# Flagged above this (calibrated: scripts/calibrate_accuracy.py, docs/accuracy_calibration.md)
PRECISION_LIMIT = 2.75
OWN_SHARE = 0.25  # the elements compared: |ref| >= OWN_SHARE * magnitude
MIN_ELEMENTS = 64  # fewer such elements: no figure (a few errors' ratio is noise)
FLAG = "precision below an fp32-accumulating kernel"
MEANING = (
    "`precision_ratio`: their rms error over the elements whose output dominates its "
    "magnitude, over that of a kernel accumulating in float32 on the same inputs "
    "(docs/method.md); a row over the limit rounds more than such a kernel does: wrong for "
    "training even where it agrees"
)


def emulated(q, k, v, *, causal: bool, scale: float, mask=None) -> torch.Tensor | None:
    """out of the float32-accumulating kernel on the case's inputs q, k, v (B, H, S, D), in
    their dtype; None where the dtype is not a low-precision one, or with a score modifier
    (correct kernels round a modifier's bias differently: SDPA takes it in q's dtype, flex
    computes it in float32; that rounding, not the accumulator's, would set the figure)."""
    import torch

    from attnbench.measure.reference import reference

    low = [torch_dtype(name) for name in LOW_PRECISION]
    if q.dtype not in low or (mask is not None and mask.score_mod is not None):
        return None
    out, _ = reference(
        q, k, v, causal=causal, scale=scale, dtype=torch.float32, mask=mask, rounded_p=q.dtype
    )
    return out.to(q.dtype)


def precision_ratio(
    out: torch.Tensor, ref: torch.Tensor, fp32_acc: torch.Tensor, m: torch.Tensor
) -> tuple[float, int] | None:
    """The figure and the count it pools: the rms error relative to the magnitude ``m``
    (measure/reference.py) over the elements whose output is at least OWN_SHARE of their
    magnitude, over the same of the float32-accumulating kernel (1: as precise as it); None
    with fewer than MIN_ELEMENTS such elements.

    Those elements are where an accumulator's rounding shows: a half-type accumulator rounds
    the running output itself, so its error grows with the output and with the number of key
    tiles (about sqrt(tiles / 2) times the kernel's), while a correct kernel's error there is
    its output's final rounding; the textbook formula in bfloat16 rounds its scores, an error
    spread over the elements whose terms cancel (small outputs). Pooled over every such
    element and head, not the largest of a few: a ratio of two maxima over two elements is
    the tail of two draws, which put correct kernels at 3 to 22 on decode rows of 8 to 16
    outputs."""
    m = m.double()
    ref64 = ref.double()
    own = (m > 0) & (ref64.abs() >= OWN_SHARE * m)  # m = 0: a query that sees no key
    count = int(own.sum())
    if count < MIN_ELEMENTS:
        return None
    err = ((out.double() - ref64) / m)[own].square().mean().sqrt().item()
    kernel = ((fp32_acc.double() - ref64) / m)[own].square().mean().sqrt().item()
    if kernel == 0:
        return (1.0 if err == 0 else math.inf), count
    return err / kernel, count


def judged(
    out: torch.Tensor,
    ref: torch.Tensor,
    fp32_acc: torch.Tensor | None,
    m: torch.Tensor,
    agrees: bool | None = True,
):
    """The row's precision columns and its note: ({precision_ratio, precision_low}, note or
    None). No columns without an emulation (float32 rows, level layer), on a row that
    disagrees (a wrong result is a disagreement, not a precision) or too few elements to pool
    (``precision_ratio``)."""
    import torch

    if fp32_acc is None or not agrees or not torch.isfinite(out).all():
        return {}, None
    figure = precision_ratio(out, ref, fp32_acc, m)
    if figure is None:
        return {}, None
    ratio, count = figure
    low = ratio > PRECISION_LIMIT
    return {"precision_ratio": ratio, "precision_low": low}, note(ratio, count) if low else None


def note(ratio: float, count: int) -> str:
    """The reason's note of a flagged row, in the terms of what was measured."""
    return (
        f"{FLAG}: out's rms error over the {count} elements where the output dominates its "
        f"magnitude is {ratio:.3g}x that kernel's on the same inputs (limit {PRECISION_LIMIT:g}x)"
    )
