"""The float64 reference and the magnitude of each checked tensor (docs/method.md, "The
agreement rule"): the ground truth that measure/agreement.py judges a call's output against.
Both run one batch element and one query chunk at a time, so the score matrix is never whole.
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
    score_mod=None,
):
    """Attention by the textbook formula in ``dtype``, one batch element and one query chunk
    at a time, so neither the score matrix nor a widened copy of k and v is ever whole (a
    decode case's KV cache can be most of the device). Returns ``(out, grads)``; grads is
    ``(dq, dk, dv)`` when ``dout`` is given.

    q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); dout (B, Hq, Sq, D). Results are in ``dtype``
    (dk/dv accumulated over chunks in at least float32). Masks, written out element by
    element (query i at position p = i + shift among the keys, key j, batch b): causal masks
    j > p; ``window`` W masks |p - j| >= W, or with causal p - j >= W; ``kv_lens`` (B,) masks
    j >= kv_lens[b] (key padding); a mask kind's ``pattern`` (a masks.Layout) by its own
    ``hidden`` rule, causal included. ``score_mod`` (a masks.ScoreMod) changes the scaled
    scores by its ``reference`` rule before the mask. A query with every key masked has
    output zero and gradients zero."""
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
    # the query head of each (kv head, group member): h = kv · group + g, (Hkv, group, 1, 1)
    heads = torch.arange(Hq, device=q.device).reshape(Hkv, group, 1, 1)
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
                if score_mod is not None:
                    s = score_mod.reference(s, heads, p, j)
                drop = _dropped(p, j, b, causal, window, kv_lens, shift, pattern)  # (c, Skv)
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


def _dropped(p, j, b, causal, window, kv_lens, shift, pattern) -> torch.Tensor:
    """True where key j is hidden from the query at position p in batch row b: (c, Skv) for
    p (c, 1) and j (1, Skv), each rule written out element by element."""
    if pattern is not None:  # the kind's own rule, causal included: (Bm, c, Skv)
        hidden = pattern.hidden(p - shift, j, causal)
        return hidden[b if hidden.shape[0] > 1 else 0]
    drop = torch.zeros(p.shape[0], j.shape[1], dtype=torch.bool, device=p.device)
    if causal:
        drop |= j > p
    if window is not None:
        drop |= (p - j >= window) if causal else ((p - j).abs() >= window)
    if kv_lens is not None:
        drop |= j >= kv_lens[b].to(p.device)
    return drop


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
    score_mod=None,
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
            scale=scale,
            dout=None if dout is None else dout[b : b + 1],
            mask=dict(causal=causal, window=window, kv_lens=kv_lens, shift=shift, pattern=pattern),
            score_mod=score_mod,
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


def _magnitude(q, k, v, *, scale, dout, mask, score_mod, batch) -> list[Magnitude]:
    B, Hq, Sq, D = q.shape
    Hkv, Skv, G = k.shape[1], k.shape[2], Hq // k.shape[1]
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
        m_dq, dq = torch.empty_like(q), torch.empty_like(q)
        # sk2: the sum over i of A^2 q^2; sv2 likewise with w^2 dout^2; dk, dv: the gradients
        sk2, sv2, dk, dv = (
            torch.zeros(B, Hq, Skv, D, dtype=f64, device=q.device) for _ in range(4)
        )
        n_k = torch.zeros(B, Hq, Skv, 1, dtype=f64, device=q.device)  # queries seeing key j
        low_k2 = low_v2 = None
    step = max(1, CHUNK_BYTES // max(B * Hq * Skv * 8, 1))  # query rows per chunk
    j = torch.arange(Skv, device=q.device)[None, :]
    for start in range(0, Sq, step):
        rows = slice(start, min(start + step, Sq))
        qc = q[:, :, rows]
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None] + mask["shift"]
        s, size, g = _scores(qc, kk, i, j, scale, mask, score_mod, batch)
        kept, p, w = _weights(s, size)
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
        ds = p * (dp - delta) * g
        a2 = (w * (dp.abs() + delta.abs()) * g).square()
        dq[:, :, rows] = scale * ds @ kk
        m_dq[:, :, rows] = scale * (a2 @ kk2).sqrt()
        sk2 += scale**2 * (a2.transpose(-1, -2) @ qc.square())
        sv2 += w2.transpose(-1, -2) @ doc.square()
        dk += scale * ds.transpose(-1, -2) @ qc
        dv += p.transpose(-1, -2) @ doc
        n_k += kept.sum(-2)[..., None].to(f64)
        if wl is not None:
            al2 = (wl * (dp.abs() + delta.abs()) * g).square()
            low_dq = torch.zeros_like(q) if low_dq is None else low_dq
            low_dq[:, :, rows] = scale * (al2 @ kk2).sqrt()
            low_k2 = torch.zeros_like(sk2) if low_k2 is None else low_k2
            low_v2 = torch.zeros_like(sk2) if low_v2 is None else low_v2
            low_k2 += scale**2 * (al2.transpose(-1, -2) @ qc.square())
            low_v2 += wl.square().transpose(-1, -2) @ doc.square()
    m_out = _plus(m_out, low_out)
    if do is None:
        return [Magnitude(m_out, n_q, low_out)]

    def per_kv(t):  # (B, Hq, Skv, X) -> (B, Hkv, Skv, X), summed over the group
        return t.view(B, Hkv, G, Skv, t.shape[-1]).sum(2)

    low_dk = None if low_k2 is None else per_kv(low_k2).sqrt()
    low_dv = None if low_v2 is None else per_kv(low_v2).sqrt()
    m_dq = _plus(m_dq + dq.abs(), low_dq)
    m_dk = _plus(per_kv(dk).abs() + per_kv(sk2).sqrt(), low_dk)
    m_dv = _plus(per_kv(dv).abs() + per_kv(sv2).sqrt(), low_dv)
    n_kv = per_kv(n_k)  # (B, Hkv, Skv, 1)
    return [
        Magnitude(m_out, n_q, low_out),
        Magnitude(m_dq, n_q, low_dq),
        Magnitude(m_dk, n_kv, low_dk),
        Magnitude(m_dv, n_kv, low_dv),
    ]


def _scores(qc, kk, i, j, scale, mask, score_mod, batch):
    """Scores of query chunk qc (1, Hq, c, D) against kk (1, Hq, Skv, D), modified and masked
    (-inf), the size that sets their rounding error (|s|, or with a modifier |s| + |change|)
    and d(modified)/d(s) (1 without a modifier): (1, Hq, c, Skv) each. i (c, 1): the queries'
    positions among the keys; j (1, Skv)."""
    s = (qc @ kk.transpose(-1, -2)) * scale  # (1, Hq, c, Skv)
    size, g = s.abs(), 1.0
    if score_mod is not None:
        heads = torch.arange(s.shape[1], device=s.device)[None, :, None, None]
        raw = s.detach().requires_grad_()
        with torch.enable_grad():
            modded = score_mod.reference(raw, heads, i, j)
            (g,) = torch.autograd.grad(modded.sum(), raw)
        s = modded.detach()
        size = raw.detach().abs() + (s - raw.detach()).abs()
    return s.masked_fill(_dropped(i, j, batch, **mask), -math.inf), size, g


def _weights(s: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """From masked scores s (B, Hq, c, Skv) and their sizes: the kept pairs, the
    probabilities p (rows with no key: zero) and the weights w = p (1 + size), each
    (B, Hq, c, Skv)."""
    kept = ~s.isneginf()
    empty = ~kept.any(-1, keepdim=True)  # queries with no key: output zero
    s = s.masked_fill(empty, 0.0)
    p = s.softmax(-1).masked_fill(empty, 0.0)
    w = torch.where(p > 0, p * (1 + size), torch.zeros_like(p))
    return kept, p, w


def _plus(m: torch.Tensor, under: torch.Tensor | None) -> torch.Tensor:
    """A magnitude with its under part added, where there is one."""
    return m if under is None else m + under
