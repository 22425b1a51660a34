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
ACC_UNIT_ROUNDOFF = 2.0**-24  # float32's: the type kernels add their long sums in
C_NORM = {
    torch.float32: {"out": 32.0, "grad": 32.0},
    torch.bfloat16: {"out": 2.25, "grad": 2.5},
    torch.float16: {"out": 2.5, "grad": 3.5},
}  # (norm): ||d|| <= C_NORM u ||r|| + C_UNDER u ||under|| + C_ACC u_acc ||sqrt(n) m||
C_ZERO = {torch.float32: 4.0, torch.bfloat16: 0.5, torch.float16: 0.5}  # ||d|| <= C_ZERO u ||m||
C_ELEM = {
    torch.float32: {"out": 32.0, "grad": 512.0},
    torch.bfloat16: {"out": 4.0, "grad": 32.0},
    torch.float16: {"out": 4.0, "grad": 32.0},
}  # (elem): |d_e| <= (C_ELEM u + C_ACC_ELEM u_acc sqrt(n_e)) max(m_e, TAU rms(m))
C_BIAS = {torch.bfloat16: 1.0}  # (bias): |<d, r>| <= C_BIAS u ||r||^2; other dtypes: none
C_UNDER = 1.0  # probabilities below the smallest normal number: their rounding's size
C_ACC = 0.25  # the accumulation's share of (norm), any dtype (the sums are float32)
C_ACC_ELEM = 1.0  # and of (elem)
BETA = 0.02  # ||r|| < BETA ||m||: the reference is (near) zero, (norm) becomes absolute
TAU = 0.1  # (elem) divides by max(m_e, TAU * rms(m)): no bound below a tenth of the typical


def unit_roundoff(dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF.get(dtype, torch.finfo(dtype).eps / 2)


@dataclass(frozen=True)
class Magnitude:
    """How large a correct computation's rounding error can be at each element of one checked
    tensor (docs/method.md). ``m``: the magnitude, the tensor's shape, float64. ``terms``: how
    many nonzero terms the element's long sum adds (the keys a query sees for out and dq, the
    (query, head) pairs that see a key for dk and dv), broadcastable to ``m``. ``under``: the
    part of ``m`` from probabilities below the dtype's smallest normal number (stored with an
    absolute precision; float16 past about 16k keys), None when there is none."""

    m: torch.Tensor
    terms: torch.Tensor
    under: torch.Tensor | None = None


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
) -> list[Magnitude]:
    """The magnitudes of ``[out]`` or ``[out, dq, dk, dv]`` (docs/method.md has the formulas),
    for q, k, v (and dout) in the case dtype, whose smallest normal number sets ``under``.
    Masks as ``reference``. Computed one batch element and one query chunk at a time (each
    element's magnitudes are its own), so the score matrix is never whole."""
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
    out = []
    for per_batch in zip(*parts):  # one tensor's magnitudes, batch element by element
        under = None
        if any(x.under is not None for x in per_batch):
            parts_under = [torch.zeros_like(x.m) if x.under is None else x.under for x in per_batch]
            under = torch.cat(parts_under)
        m, terms = torch.cat([x.m for x in per_batch]), torch.cat([x.terms for x in per_batch])
        out.append(Magnitude(m, terms, under))
    return out


def _magnitude(
    q, k, v, *, causal, scale, dout, window, kv_lens, shift, pattern, batch
) -> list[Magnitude]:
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    f64 = torch.float64
    tiny = torch.finfo(q.dtype).tiny  # the case dtype's smallest normal number
    q, k, v = (t.detach().to(f64) for t in (q, k, v))
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B, Hq, Skv, D)
    kk2, vv2 = kk.square(), vv.square()
    do = None if dout is None else dout.detach().to(f64)
    m_out = torch.empty_like(q)
    n_q = torch.empty(B, Hq, Sq, 1, dtype=f64, device=q.device)  # keys each query sees
    low_out = low_dq = None  # the under parts, made when some probability is below tiny
    if do is not None:
        m_dq = torch.empty_like(q)
        dq = torch.empty_like(q)
        sk2 = torch.zeros(B, Hq, Skv, D, dtype=f64, device=q.device)  # sum over i of A^2 q^2
        sv2 = torch.zeros_like(sk2)
        dk = torch.zeros_like(sk2)
        dv = torch.zeros_like(sk2)
        n_k = torch.zeros(B, Hq, Skv, 1, dtype=f64, device=q.device)  # queries seeing key j
        low_k2 = low_v2 = None
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
        kept = ~s.isneginf()  # (B, Hq, c, Skv)
        empty = ~kept.any(-1, keepdim=True)  # queries with no key: output zero
        s = s.masked_fill(empty, 0.0)
        p = s.softmax(-1).masked_fill(empty, 0.0)
        w = torch.where(p > 0, p * (1 + s.abs()), torch.zeros_like(p))
        w2 = w.square()
        n_q[:, :, rows] = kept.sum(-1, keepdim=True).to(f64)
        low = kept & (p < tiny)  # stored with the absolute precision u * tiny, not u * p
        wl = torch.where(low, tiny, torch.zeros_like(p)) if low.any() else None
        out = p @ vv
        m_out[:, :, rows] = out.abs() + (w2 @ vv2).sqrt()
        if wl is not None:
            low_out = torch.zeros_like(q) if low_out is None else low_out
            low_out[:, :, rows] = (wl.square() @ vv2).sqrt()
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
        n_k += kept.sum(-2)[..., None].to(f64)
        if wl is not None:
            al2 = (wl * (dp.abs() + delta.abs())).square()
            low_dq = torch.zeros_like(q) if low_dq is None else low_dq
            low_dq[:, :, rows] = scale * (al2 @ kk2).sqrt()
            low_k2 = torch.zeros_like(sk2) if low_k2 is None else low_k2
            low_v2 = torch.zeros_like(sk2) if low_v2 is None else low_v2
            low_k2 += scale**2 * (al2.transpose(-1, -2) @ qc.square())
            low_v2 += wl.square().transpose(-1, -2) @ doc.square()
    m_out = m_out if low_out is None else m_out + low_out
    if do is None:
        return [Magnitude(m_out, n_q, low_out)]

    def per_kv(t):  # (B, Hq, Skv, X) -> (B, Hkv, Skv, X), summed over the group
        return t.view(B, Hkv, G, Skv, t.shape[-1]).sum(2)

    m_dq = m_dq + dq.abs()
    m_dk = per_kv(dk).abs() + per_kv(sk2).sqrt()
    m_dv = per_kv(dv).abs() + per_kv(sv2).sqrt()
    low_dk = None if low_k2 is None else per_kv(low_k2).sqrt()
    low_dv = None if low_v2 is None else per_kv(low_v2).sqrt()
    m_dq = m_dq if low_dq is None else m_dq + low_dq
    m_dk = m_dk if low_dk is None else m_dk + low_dk
    m_dv = m_dv if low_dv is None else m_dv + low_dv
    n_kv = per_kv(n_k)  # (B, Hkv, Skv, 1)
    return [
        Magnitude(m_out, n_q, low_out),
        Magnitude(m_dq, n_q, low_dq),
        Magnitude(m_dk, n_kv, low_dk),
        Magnitude(m_dv, n_kv, low_dv),
    ]


def _kind(tensor: str) -> str:
    return "out" if tensor == "out" else "grad"


@dataclass(frozen=True)
class Error:
    """Errors of one tensor against its reference, with the rule's bounds on them.

    err_norm: ||d||; norm_bound: what (norm) allows it (the rel form, or the absolute one when
    the reference is near zero). rel: ||d|| / ||r||, or None when the reference is near zero
    (||r|| < BETA ||m||). elem_err: |d_e| at the element e nearest (or furthest past) its own
    bound, elem_bound that bound, elem_index its index. bias: <d, r> / ||r||^2, the error's
    share along the reference (a wrong scale is all along it; rounding mostly across it),
    bias_bound what (bias) allows its size (None: not checked in this dtype, or the reference
    is near zero). max_abs: max |d| over the tensor (for the CSV). terms: the most terms any
    element's sum adds. under_norm, acc_norm: ||under|| and u_acc ||sqrt(n) m||, the parts
    of norm_bound the constants multiply."""

    max_abs: float
    rel: float | None
    ref_norm: float
    mag_norm: float
    err_norm: float
    norm_bound: float
    elem_err: float
    elem_bound: float
    elem_index: tuple = ()
    terms: int = 1
    bias: float = 0.0
    bias_bound: float | None = None
    under_norm: float = 0.0
    acc_norm: float = 0.0

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs)

    @property
    def near_zero(self) -> bool:
        """The reference is (near) zero: (norm) is the absolute one, from ||m||."""
        return _near_zero(self.ref_norm, self.mag_norm)

    @property
    def abs_ratio(self) -> float:
        """||d|| / ||m||."""
        if self.mag_norm:
            return self.err_norm / self.mag_norm
        return 0.0 if self.err_norm == 0 else math.inf

    @property
    def rel_bound(self) -> float | None:
        """(norm) as a bound on ``rel``; None when the reference is near zero."""
        return None if self.near_zero else self.norm_bound / self.ref_norm

    @property
    def norm_share(self) -> float:
        """||d|| / its bound (1.0: at the bound)."""
        return _share(self.err_norm, self.norm_bound)

    @property
    def elem_share(self) -> float:
        """|d_e| / its bound at the element nearest its bound."""
        return _share(self.elem_err, self.elem_bound)


def _near_zero(ref_norm: float, mag_norm: float) -> bool:
    """||r|| < BETA ||m||, or r is all zero."""
    return ref_norm < BETA * mag_norm or ref_norm == 0


def _share(err: float, bound: float) -> float:
    """err / bound, where a zero bound holds only a zero error."""
    if bound > 0:
        return err / bound
    return 0.0 if err == 0 else math.inf


def error(
    x: torch.Tensor,
    ref: torch.Tensor,
    mag: Magnitude,
    tensor: str = "out",
    dtype: torch.dtype | None = None,
) -> Error:
    """Errors of ``x`` against ``ref`` (float64) and the rule's bounds, given ``mag``
    (``magnitude``'s entry for the same tensor), for tensor ``tensor`` ("out", "dq", "dk",
    "dv") of a case in ``dtype`` (default: x's). Computed in float64; NaN/Inf in x give inf."""
    dtype = x.dtype if dtype is None else dtype
    u, kind, f64 = unit_roundoff(dtype), _kind(tensor), torch.float64
    x64, r64, m64 = (t.detach().to(f64) for t in (x, ref, mag.m))
    root_n = mag.terms.to(f64).sqrt()  # broadcasts against m
    ref_norm = torch.linalg.vector_norm(r64).item()
    mag_norm = torch.linalg.vector_norm(m64).item()
    under = 0.0 if mag.under is None else torch.linalg.vector_norm(mag.under).item()
    accumulated = ACC_UNIT_ROUNDOFF * torch.linalg.vector_norm(root_n * m64).item()
    near_zero = _near_zero(ref_norm, mag_norm)
    if near_zero:
        norm_bound = C_ZERO[dtype] * u * mag_norm
    else:
        norm_bound = C_NORM[dtype][kind] * u * ref_norm
    norm_bound += C_UNDER * u * under + C_ACC * accumulated
    terms = int(mag.terms.max().item()) if mag.terms.numel() else 0
    if not torch.isfinite(x64).all():
        inf = math.inf
        return Error(
            inf, inf, ref_norm, mag_norm, inf, norm_bound, inf, math.nan, (), terms,
            under_norm=under, acc_norm=accumulated,
        )  # fmt: skip
    bias = 0.0 if near_zero else ((x64 - r64) * r64).sum().item() / ref_norm**2
    bias_bound = None if near_zero or dtype not in C_BIAS else C_BIAS[dtype] * u
    d = (x64 - r64).abs()
    err_norm = torch.linalg.vector_norm(d).item()
    floor = TAU * m64.square().mean().sqrt().item()
    per_elem = C_ELEM[dtype][kind] * u + C_ACC_ELEM * ACC_UNIT_ROUNDOFF * root_n
    b = (per_elem * torch.clamp(m64, min=floor)).expand_as(d)
    ratio = torch.where(d == 0, torch.zeros_like(d), d / b)
    at = int(ratio.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), d.shape))
    return Error(
        d.max().item(),
        None if near_zero else (err_norm / ref_norm if err_norm else 0.0),
        ref_norm,
        mag_norm,
        err_norm,
        norm_bound,
        d.flatten()[at].item(),
        b.flatten()[at].item(),
        index,
        terms,
        bias,
        bias_bound,
        under,
        accumulated,
    )


def bound(err: Error) -> tuple[float | None, float]:
    """(rel bound, max-abs bound): ``err.rel`` must stay within the first (None when the
    reference is near zero: then ``err.err_norm`` within ``err.norm_bound``) and
    ``err.elem_err`` (|d| at the element nearest its own bound) within the second."""
    return err.rel_bound, err.elem_bound


def failed(err: Error) -> list[str]:
    """The criteria ``err`` fails ([] when it agrees): 'non-finite', 'rel', 'abs (reference
    near zero)', 'bias' (the error along the reference), 'max-abs' (the element-wise one)."""
    if not err.finite:
        return ["non-finite"]
    out = []
    if err.err_norm > err.norm_bound:
        out.append("abs (reference near zero)" if err.near_zero else "rel")
    if err.bias_bound is not None and abs(err.bias) > err.bias_bound:
        out.append("bias")
    if err.elem_err > err.elem_bound:
        out.append("max-abs")
    return out


def agrees(err: Error) -> bool:
    """The rule (docs/method.md)."""
    return not failed(err)


@dataclass(frozen=True)
class Verdict:
    """The rule's verdict on one call: per checked tensor its Error and failed criteria, the
    row's accuracy columns, and the notes for its ``reason``."""

    errors: list[Error]
    failures: list[list[str]]
    columns: dict
    notes: list[str]

    @property
    def agrees(self) -> bool:
        return not any(self.failures)


def judge(
    names: list[str],
    got: list[torch.Tensor],
    ref: list[torch.Tensor],
    mags: list[Magnitude],
    dtype: torch.dtype,
) -> Verdict:
    """The rule (docs/method.md) on the checked tensors ``names`` (out, dq, dk, dv) of one
    call, in the case's ``dtype``: what the harness writes in a row and what the calibration
    counts. ``columns`` are the row's max_abs_err, max_abs_bound, rel_err, err_bound and
    agrees; the tensor nearest to (or furthest past) each bound speaks for its columns."""
    errs = [error(x, r, m, n, dtype) for n, x, r, m in zip(names, got, ref, mags)]
    fails = [failed(e) for e in errs]
    notes, bad = [], []
    for n, e, why in zip(names, errs, fails):
        if e.finite and e.near_zero:
            notes.append(
                f"{n}: the reference is zero (||ref|| < {BETA:g} ||magnitude||), so rel_err "
                f"is not defined; judged by ||err|| = {e.abs_ratio:.3g} ||magnitude|| <= "
                f"{_share(e.norm_bound, e.mag_norm):.3g} ||magnitude||"
            )
        for criterion in why:
            if criterion == "non-finite":
                bad.append(f"{n} non-finite (NaN/Inf)")
            elif criterion == "rel":
                bad.append(f"{n} rel {e.rel:.3g} > {e.rel_bound:.3g}")
            elif criterion == "max-abs":
                bad.append(f"{n} max-abs {e.elem_err:.3g} > {e.elem_bound:.3g} at {e.elem_index}")
            elif criterion == "bias":
                bad.append(
                    f"{n} bias (the error along the reference, <err, ref> / ||ref||^2) "
                    f"{e.bias:.3g}, beyond +-{e.bias_bound:.3g}"
                )
            else:
                bad.append(
                    f"{n} abs (reference zero): ||err|| = {e.abs_ratio:.3g} ||magnitude|| > "
                    f"{_share(e.norm_bound, e.mag_norm):.3g} ||magnitude||"
                )
    if bad:
        notes.append("disagrees with the float64 reference: " + "; ".join(bad))
    if not all(e.finite for e in errs):
        return Verdict(errs, fails, {"agrees": False}, notes)
    with_rel = [k for k in range(len(errs)) if errs[k].rel is not None]
    i = max(with_rel, key=lambda k: errs[k].norm_share, default=None)
    j = max(range(len(errs)), key=lambda k: errs[k].elem_share)
    columns = {
        "max_abs_err": errs[j].elem_err,
        "max_abs_bound": errs[j].elem_bound,
        "rel_err": None if i is None else errs[i].rel,
        "err_bound": None if i is None else errs[i].rel_bound,
        "agrees": not bad,
    }
    return Verdict(errs, fails, columns, notes)


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
