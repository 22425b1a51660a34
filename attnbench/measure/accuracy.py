"""Float64 chunked reference, the magnitude of each checked tensor, error metrics and the
agreement rule.

The rule, its constants and the magnitude's formulas are written once, in docs/method.md ("The
agreement rule"); scripts/calibrate_accuracy.py derives the constants and
docs/accuracy_calibration.md holds its table. Level ``layer`` keeps the legacy rule
(``legacy_error``, ``legacy_bound``, ``legacy_agrees``; also in docs/method.md), because the
magnitude is defined for the attention op only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK_BYTES = 256 * 2**20  # score-matrix bytes per query chunk of the reference


def _chunk_rows(heads: int, seq_kv: int, dtype: torch.dtype) -> int:
    """Query rows per chunk of one batch element, so its scores stay near CHUNK_BYTES."""
    per_row = heads * seq_kv * torch.finfo(dtype).bits // 8
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
    shift: int = 0,
    pattern=None,
):
    """Attention by the textbook formula in ``dtype``, one batch element and one query chunk
    at a time, so neither the score matrix nor a widened copy of k and v is ever whole (a
    decode case's KV cache can be most of the device). Returns ``(out, grads)``; grads is
    ``(dq, dk, dv)`` when ``dout`` is given.

    q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); dout (B, Hq, Sq, D). Results are in ``dtype``
    (dk/dv accumulated over chunks in at least float32). Masks, written out element by
    element (query i at position p = i + shift among the keys, key j, batch b): causal masks
    j > p; ``window`` W masks |p - j| >= W, or with causal p - j >= W; ``kv_lens`` (B,) masks
    j >= kv_lens[b] (key padding); ``pattern`` (a patterns.Pattern: packed documents or a
    sparse layout) as ``pattern_masked``. A query with every key masked has output zero and
    gradients zero."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    acc = torch.promote_types(dtype, torch.float32)
    grad = dout is not None
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    dq = torch.empty_like(out) if grad else None
    dk = torch.empty(k.shape, dtype=dtype, device=q.device) if grad else None
    dv = torch.empty_like(dk) if grad else None
    step = _chunk_rows(Hq, Skv, dtype)
    j = torch.arange(Skv, device=q.device)[None, :]  # (1, Skv)
    for b in range(B):
        kb = k[b].detach().to(dtype)[:, None].requires_grad_(grad)  # (Hkv, 1, Skv, D)
        vb = v[b].detach().to(dtype)[:, None].requires_grad_(grad)
        gk = torch.zeros(kb.shape, dtype=acc, device=q.device) if grad else None
        gv = torch.zeros_like(gk) if grad else None
        for start in range(0, Sq, step):
            rows = slice(start, min(start + step, Sq))
            c = rows.stop - rows.start
            # query head h reads kv head h // group: (Hq, c, D) -> (Hkv, group, c, D)
            qc = q[b, :, rows].detach().to(dtype).reshape(Hkv, group, c, D)
            qc.requires_grad_(grad)
            with torch.enable_grad() if grad else torch.no_grad():
                s = (qc @ kb.transpose(-1, -2)) * scale  # (Hkv, group, c, Skv)
                p = torch.arange(rows.start, rows.stop, device=q.device)[:, None] + shift
                drop = torch.zeros(c, Skv, dtype=torch.bool, device=q.device)  # (c, Skv)
                if causal:
                    drop |= j > p
                if window is not None:
                    drop |= (p - j >= window) if causal else ((p - j).abs() >= window)
                if kv_lens is not None:
                    drop |= j >= kv_lens[b].to(q.device)
                if pattern is not None:  # (Bm, 1, c, Skv): this batch row's
                    hidden = pattern_masked(pattern, p - shift, j)
                    drop |= hidden[b if hidden.shape[0] > 1 else 0, 0]
                empty = drop.all(dim=-1, keepdim=True)  # (c, 1): no key at all
                s = s.masked_fill(drop, float("-inf")).masked_fill(empty, 0.0)
                oc = s.softmax(dim=-1).masked_fill(empty, 0.0) @ vb  # (Hkv, group, c, D)
            out[b, :, rows] = oc.detach().reshape(Hq, c, D)
            if grad:
                g = dout[b, :, rows].to(dtype).reshape(Hkv, group, c, D)
                gq, gkc, gvc = torch.autograd.grad(oc, (qc, kb, vb), g)
                dq[b, :, rows] = gq.reshape(Hq, c, D)
                gk += gkc
                gv += gvc
        if grad:
            dk[b], dv[b] = gk[:, 0].to(dtype), gv[:, 0].to(dtype)
    return out, ((dq, dk, dv) if grad else None)


def pattern_masked(pattern, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """True where a pattern mask hides key j from query i: (Bm, 1, c, Skv) for query indices
    i (c, 1) and key indices j (1, Skv). Written from the drawn data alone (docs/method.md):
    document: j and i lie in different documents of row b (documents laid end to end with
    ``pattern.doc_lens[b]``); block_sparse with block P: i // P and j // P further apart than
    (local - 1) / 2, neither below ``n_global``, and j // P not among ``pattern.random[i // P]``;
    strided: |i // P - j // P| >= stride and (i // P - j // P) % stride != 0."""
    if pattern.kind == "document":
        rows = []
        for lens in pattern.doc_lens:
            doc = torch.empty(sum(lens), dtype=torch.int64)
            start = 0
            for number, length in enumerate(lens):
                doc[start : start + length] = number
                start += length
            rows.append(doc)
        doc = torch.stack(rows).to(i.device)  # (B, S): each position's document
        return (doc[:, i] != doc[:, j])[:, None]  # (B, 1, c, Skv)
    qb, kb = i // pattern.block, j // pattern.block  # (c, 1), (1, Skv)
    if pattern.kind == "strided":
        near = (qb - kb).abs() < pattern.stride
        return ~(near | ((qb - kb) % pattern.stride == 0))[None, None]
    kept = (qb - kb).abs() <= (pattern.local - 1) // 2
    kept |= (qb < pattern.n_global) | (kb < pattern.n_global)
    drawn = pattern.random.to(i.device)[qb[:, 0]]  # (c, r): key blocks drawn for each query
    kept |= (drawn[:, None, :] == kb[..., None]).any(-1)  # (c, Skv)
    return ~kept[None, None]


# The rule's constants (docs/method.md), calibrated by scripts/calibrate_accuracy.py
# (docs/accuracy_calibration.md). u = unit roundoff = eps / 2.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
_HALF = {"out": 1.75, "grad": 2.25}
C_NORM = {
    torch.float32: {"out": 32.0, "grad": 32.0},
    torch.bfloat16: _HALF,
    torch.float16: _HALF,
}  # (norm): ||d|| <= C_NORM u ||r||
C_ZERO = {torch.float32: 4.0, torch.bfloat16: 0.5, torch.float16: 0.5}  # ||d|| <= C_ZERO u ||m||
C_ELEM = {
    torch.float32: {"out": 32.0, "grad": 512.0},
    torch.bfloat16: {"out": 4.0, "grad": 32.0},
    torch.float16: {"out": 4.0, "grad": 32.0},
}  # (elem)
BETA = 0.02  # ||r|| < BETA ||m||: the reference is (near) zero, (norm) becomes absolute
TAU = 0.1  # (elem) divides by max(m_e, TAU * rms(m)): no bound below a tenth of the typical


def unit_roundoff(dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF.get(dtype, torch.finfo(dtype).eps / 2)


def magnitude(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float,
    dout=None,
    window: int | None = None,
    kv_lens: torch.Tensor | None = None,
    shift: int = 0,
    pattern=None,
) -> list[torch.Tensor]:
    """float64 magnitudes ``[m_out]`` or ``[m_out, m_dq, m_dk, m_dv]`` (same shapes as the
    reference's out and grads; docs/method.md has the formulas). Masks as ``reference``.
    Computed one batch element and one query chunk at a time (each element's magnitudes are
    its own), so the score matrix is never whole."""
    parts = [
        _magnitude(
            q[b : b + 1],
            k[b : b + 1],
            v[b : b + 1],
            causal=causal,
            scale=scale,
            dout=None if dout is None else dout[b : b + 1],
            window=window,
            kv_lens=None if kv_lens is None else kv_lens[b : b + 1],
            shift=shift,
            pattern=pattern,
            batch=b,
        )
        for b in range(q.shape[0])
    ]
    return [torch.cat(ts) for ts in zip(*parts)]


def _magnitude(
    q, k, v, *, causal, scale, dout, window, kv_lens, shift, pattern, batch
) -> list[torch.Tensor]:
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    f64 = torch.float64
    q, k, v = (t.detach().to(f64) for t in (q, k, v))
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B, Hq, Skv, D)
    kk2, vv2 = kk.square(), vv.square()
    do = None if dout is None else dout.detach().to(f64)
    m_out = torch.empty_like(q)
    if do is not None:
        m_dq = torch.empty_like(q)
        dq = torch.empty_like(q)
        sk2 = torch.zeros(B, Hq, Skv, D, dtype=f64, device=q.device)  # sum over i of A^2 q^2
        sv2 = torch.zeros_like(sk2)
        dk = torch.zeros_like(sk2)
        dv = torch.zeros_like(sk2)
    per_row = B * Hq * Skv * 8
    step = max(1, CHUNK_BYTES // max(per_row, 1))
    j = torch.arange(Skv, device=q.device)[None, :]
    for start in range(0, Sq, step):
        rows = slice(start, min(start + step, Sq))
        qc = q[:, :, rows]
        s = (qc @ kk.transpose(-1, -2)) * scale  # (B, Hq, c, Skv)
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None] + shift
        if causal:
            s = s.masked_fill(j > i, -math.inf)
        if window is not None:
            s = s.masked_fill((i - j >= window) if causal else ((i - j).abs() >= window), -math.inf)
        if kv_lens is not None:
            s = s.masked_fill(j >= kv_lens.to(q.device)[:, None, None, None], -math.inf)
        if pattern is not None:  # (Bm, 1, c, Skv): this element's row
            hidden = pattern_masked(pattern, i - shift, j)
            s = s.masked_fill(
                hidden[batch : batch + 1] if hidden.shape[0] > 1 else hidden, -math.inf
            )
        empty = s.isneginf().all(-1, keepdim=True)  # queries with no key: output zero
        s = s.masked_fill(empty, 0.0)
        p = s.softmax(-1).masked_fill(empty, 0.0)
        w = torch.where(p > 0, p * (1 + s.abs()), torch.zeros_like(p))
        w2 = w.square()
        out = p @ vv
        m_out[:, :, rows] = out.abs() + (w2 @ vv2).sqrt()
        if do is None:
            continue
        doc = do[:, :, rows]
        dp = doc @ vv.transpose(-1, -2)
        delta = (doc * out).sum(-1, keepdim=True)
        a = w * (dp.abs() + delta.abs())
        ds = p * (dp - delta)
        a2 = a.square()
        dq[:, :, rows] = scale * ds @ kk
        m_dq[:, :, rows] = scale * (a2 @ kk2).sqrt()
        sk2 += scale**2 * (a2.transpose(-1, -2) @ qc.square())
        sv2 += w2.transpose(-1, -2) @ doc.square()
        dk += scale * ds.transpose(-1, -2) @ qc
        dv += p.transpose(-1, -2) @ doc
    if do is None:
        return [m_out]

    def per_kv(t):  # (B, Hq, Skv, D) -> (B, Hkv, Skv, D), summed over the group
        return t.view(B, Hkv, G, Skv, D).sum(2)

    m_dq = m_dq + dq.abs()
    m_dk = per_kv(dk).abs() + per_kv(sk2).sqrt()
    m_dv = per_kv(dv).abs() + per_kv(sv2).sqrt()
    return [m_out, m_dq, m_dk, m_dv]


def _kind(tensor: str) -> str:
    return "out" if tensor == "out" else "grad"


@dataclass(frozen=True)
class Error:
    """Errors of one tensor against its reference, with what the bound needs.

    rel: ||d|| / ||r||, or None when the reference is (near) zero (||r|| < BETA ||m||); then
    ``abs_ratio`` = ||d|| / ||m|| is judged instead. elem_ratio: max_e |d_e| / max(m_e, TAU
    rms(m)); at that element ``elem_err`` = |d_e| and ``elem_mag`` = the denominator.
    max_abs: max |d| over the tensor (for the CSV)."""

    max_abs: float
    rel: float | None
    ref_norm: float
    mag_norm: float
    abs_ratio: float  # ||d|| / ||m||
    elem_ratio: float
    elem_err: float
    elem_mag: float
    elem_index: tuple = ()

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs)

    @property
    def near_zero(self) -> bool:
        """The reference is (near) zero: (norm) is the absolute ||d|| <= C_ZERO u ||m||."""
        return self.ref_norm < BETA * self.mag_norm


def elem_ratio(
    d: torch.Tensor, m: torch.Tensor, tau: float | None = None
) -> tuple[float, int, float]:
    """max_e |d_e| / max(m_e, tau rms(m)) (0 where d_e = 0), its flat index and denominator."""
    tau = TAU if tau is None else tau
    den = torch.clamp(m, min=tau * m.square().mean().sqrt().item())
    ratio = torch.where(d == 0, torch.zeros_like(d), d / den)
    at = int(ratio.flatten().argmax())
    return ratio.flatten()[at].item(), at, den.flatten()[at].item()


def error(x: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor) -> Error:
    """Errors of ``x`` against ``ref`` (float64) given ``mag`` (``magnitude``'s tensor of the
    same name), computed in float64. NaN/Inf in x give inf."""
    x64, r64, m64 = (t.detach().to(torch.float64) for t in (x, ref, mag))
    ref_norm = torch.linalg.vector_norm(r64).item()
    mag_norm = torch.linalg.vector_norm(m64).item()
    if not torch.isfinite(x64).all():
        return Error(math.inf, math.inf, ref_norm, mag_norm, math.inf, math.inf, math.inf, math.nan)
    d = (x64 - r64).abs()
    dnorm = torch.linalg.vector_norm(d).item()
    near_zero = ref_norm < BETA * mag_norm
    rel = None if near_zero else (dnorm / ref_norm if dnorm else 0.0)
    ratio, at, den = elem_ratio(d, m64)
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), d.shape))
    return Error(
        d.max().item(),
        rel,
        ref_norm,
        mag_norm,
        dnorm / mag_norm if mag_norm else (0.0 if dnorm == 0 else math.inf),
        ratio,
        d.flatten()[at].item(),
        den,
        index,
    )


def bound(err: Error, dtype: torch.dtype, tensor: str = "out") -> tuple[float | None, float]:
    """(rel bound, max-abs bound) of tensor ``tensor`` ("out", "dq", "dk", "dv"): ``err.rel``
    must stay within the first (None when the reference is near zero: then ||d|| must stay
    within ``C_ZERO u ||m||``) and ``err.elem_err`` (|d| at the element nearest its own bound)
    within the second."""
    u = unit_roundoff(dtype)
    k = _kind(tensor)
    return (None if err.near_zero else C_NORM[dtype][k] * u), C_ELEM[dtype][k] * u * err.elem_mag


def failed(err: Error, dtype: torch.dtype, tensor: str = "out") -> list[str]:
    """The criteria ``err`` fails ([] when it agrees): 'non-finite', 'rel', 'abs (reference
    near zero)', 'max-abs' (the element-wise criterion)."""
    if not err.finite:
        return ["non-finite"]
    u = unit_roundoff(dtype)
    k = _kind(tensor)
    out = []
    if err.near_zero:
        if err.abs_ratio > C_ZERO[dtype] * u:
            out.append("abs (reference near zero)")
    elif err.rel > C_NORM[dtype][k] * u:
        out.append("rel")
    if err.elem_ratio > C_ELEM[dtype][k] * u:
        out.append("max-abs")
    return out


def agrees(err: Error, dtype: torch.dtype, tensor: str = "out") -> bool:
    """The rule (docs/method.md), for tensor ``tensor`` of the case's ``dtype``."""
    return not failed(err, dtype, tensor)


# --- level layer: the legacy rule (docs/method.md) -----------------------------------------
AGREE_FACTOR = 2.0  # within 2x the same-dtype textbook baseline's error
ABS_FLOOR_EPS = 4.0  # plus 4 eps max|ref| on the max abs error (one eps on the relative one)


@dataclass(frozen=True)
class LegacyError:
    """Level layer only: errors for the legacy rule (docs/method.md)."""

    max_abs: float
    rel: float
    ref_max_abs: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs) and math.isfinite(self.rel)


def legacy_error(x: torch.Tensor, ref: torch.Tensor) -> LegacyError:
    """Errors of ``x`` against ``ref``, computed in float64; NaN/Inf in x give inf."""
    x64, r64 = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        return LegacyError(math.inf, math.inf, r64.abs().max().item())
    diff = x64 - r64
    ref_norm = torch.linalg.vector_norm(r64).item()
    return LegacyError(
        diff.abs().max().item(),
        torch.linalg.vector_norm(diff).item() / max(ref_norm, 1e-300),
        r64.abs().max().item(),
    )


def legacy_bound(baseline: LegacyError, dtype: torch.dtype) -> tuple[float, float]:
    """(rel bound, max-abs bound) for a tensor whose baseline error is ``baseline``."""
    eps = torch.finfo(dtype).eps
    return (
        AGREE_FACTOR * baseline.rel + eps,
        AGREE_FACTOR * baseline.max_abs + ABS_FLOOR_EPS * eps * baseline.ref_max_abs,
    )


def legacy_agrees(err: LegacyError, baseline: LegacyError, dtype: torch.dtype) -> bool:
    rel_bound, abs_bound = legacy_bound(baseline, dtype)
    return err.finite and err.rel <= rel_bound and err.max_abs <= abs_bound
