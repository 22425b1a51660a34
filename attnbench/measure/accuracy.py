"""Float64 chunked reference, error metrics and the agreement rule.

The rule (README, "Accuracy"): an impl agrees when every checked tensor (out; and dq, dk, dv
with backward) is finite and both its relative error ||x - ref|| / ||ref|| and its max abs error
are within ``2 x`` the error of the textbook formula run in the same dtype on the same device
(the *baseline*), plus a small floor: one machine epsilon of the dtype for the relative error,
``4 eps x max|ref|`` for the max abs error (a maximum over many elements fluctuates more between
two correct summation orders than a norm does: up to ~4x the baseline's was seen for correct
fp32 impls). The floor keeps the bound meaningful where the baseline is exact by luck.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

AGREE_FACTOR = 2.0
ABS_FLOOR_EPS = 4.0
CHUNK_BYTES = 256 * 2**20  # score-matrix bytes per query chunk of the reference


def _chunk_rows(batch: int, heads: int, seq_kv: int, dtype: torch.dtype) -> int:
    per_row = batch * heads * seq_kv * torch.finfo(dtype).bits // 8
    return max(1, CHUNK_BYTES // max(per_row, 1))


def reference(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float,
    dout=None,
    dtype=torch.float64,
    window: int | None = None,
    kv_lens: torch.Tensor | None = None,
):
    """Attention by the textbook formula in ``dtype``, over query chunks so the score matrix
    is never whole. Returns ``(out, grads)``; grads is ``(dq, dk, dv)`` when ``dout`` is given.

    q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); dout (B, Hq, Sq, D). Results are in ``dtype``
    (dk/dv accumulated over chunks in at least float32). Masks, written out element by
    element (query i, key j, batch b): causal masks j > i; ``window`` W masks |i - j| >= W, or
    with causal i - j >= W; ``kv_lens`` (B,) masks j >= kv_lens[b] (key padding)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    acc = torch.promote_types(dtype, torch.float32)
    q, k, v = (t.detach().to(dtype) for t in (q, k, v))
    kk = k.repeat_interleave(group, dim=1).requires_grad_(dout is not None)  # (B, Hq, Skv, D)
    vv = v.repeat_interleave(group, dim=1).requires_grad_(dout is not None)
    out = torch.empty_like(q)
    dq = torch.empty_like(q) if dout is not None else None
    dkk = torch.zeros(kk.shape, dtype=acc, device=q.device) if dout is not None else None
    dvv = torch.zeros_like(dkk) if dout is not None else None
    step = _chunk_rows(B, Hq, Skv, dtype)
    for start in range(0, Sq, step):
        rows = slice(start, min(start + step, Sq))
        qc = q[:, :, rows].requires_grad_(dout is not None)  # (B, Hq, c, D)
        with torch.enable_grad() if dout is not None else torch.no_grad():
            s = (qc @ kk.transpose(-1, -2)) * scale  # (B, Hq, c, Skv)
            i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]  # (c, 1)
            j = torch.arange(Skv, device=q.device)[None, :]  # (1, Skv)
            if causal:
                s = s.masked_fill(j > i, float("-inf"))
            if window is not None:
                s = s.masked_fill(
                    (i - j >= window) if causal else ((i - j).abs() >= window), float("-inf")
                )
            if kv_lens is not None:
                padded = j >= kv_lens.to(q.device)[:, None, None, None]  # (B, 1, 1, Skv)
                s = s.masked_fill(padded, float("-inf"))
            oc = s.softmax(dim=-1) @ vv  # (B, Hq, c, D)
        out[:, :, rows] = oc.detach()
        if dout is not None:
            gq, gk, gv = torch.autograd.grad(oc, (qc, kk, vv), dout[:, :, rows].to(dtype))
            dq[:, :, rows] = gq
            dkk += gk
            dvv += gv
    if dout is None:
        return out, None
    # sum the grads of the query heads that share one kv head: (B, Hkv, group, Skv, D)
    dk = dkk.view(B, Hkv, group, Skv, D).sum(2).to(dtype)
    dv = dvv.view(B, Hkv, group, Skv, D).sum(2).to(dtype)
    return out, (dq, dk, dv)


@dataclass(frozen=True)
class Error:
    max_abs: float
    rel: float
    ref_max_abs: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs) and math.isfinite(self.rel)


def error(x: torch.Tensor, ref: torch.Tensor) -> Error:
    """Errors of ``x`` against ``ref``, computed in float64; NaN/Inf in x give inf."""
    x64, r64 = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        return Error(math.inf, math.inf, r64.abs().max().item())
    diff = x64 - r64
    ref_norm = torch.linalg.vector_norm(r64).item()
    return Error(
        diff.abs().max().item(),
        torch.linalg.vector_norm(diff).item() / max(ref_norm, 1e-300),
        r64.abs().max().item(),
    )


def bound(baseline: Error, dtype: torch.dtype) -> tuple[float, float]:
    """(rel bound, max-abs bound) for a tensor whose baseline error is ``baseline``."""
    eps = torch.finfo(dtype).eps
    return (
        AGREE_FACTOR * baseline.rel + eps,
        AGREE_FACTOR * baseline.max_abs + ABS_FLOOR_EPS * eps * baseline.ref_max_abs,
    )


def agrees(err: Error, baseline: Error, dtype: torch.dtype) -> bool:
    rel_bound, abs_bound = bound(baseline, dtype)
    return err.finite and err.rel <= rel_bound and err.max_abs <= abs_bound
