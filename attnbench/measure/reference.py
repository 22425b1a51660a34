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
    mask=None,
    rounded_p=None,
):
    """Attention by the textbook formula in ``dtype``, one batch element and one query chunk
    at a time, so neither the score matrix nor a widened copy of k and v is ever whole (a
    decode case's KV cache can be most of the device). Returns ``(out, grads)``; grads is
    ``(dq, dk, dv)`` when ``dout`` is given.

    q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); dout (B, Hq, Sq, D). Results are in ``dtype``
    (dk/dv accumulated over chunks in at least float32). ``mask`` (a masks.Mask; None: none):
    its layout's ``hidden`` rule, causal included, written out element by element apart from
    the rule impls run (without a layout, causal alone: query i at position p = i + shift
    among the keys does not see j > p); its score modifier's ``reference`` rule changes the
    scaled scores of query position p before the mask. A query with every key masked has
    output zero and gradients zero. ``rounded_p`` (forward only; None: exact softmax): a
    flash kernel's arithmetic instead, the probabilities exp(s - max) rounded to that dtype
    before P V and the row divided by their unrounded sum after it."""
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
    shift, score_mod = _shift(mask, Sq, Skv), None if mask is None else mask.score_mod
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
                i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]  # (c, 1)
                if score_mod is not None:
                    s = score_mod.reference(s, heads, i + shift, j)
                drop = _hidden(mask, i, j, b, causal, shift)  # (c, Skv)
                empty = drop.all(dim=-1, keepdim=True)  # (c, 1): no key at all
                s = s.masked_fill(drop, float("-inf")).masked_fill(empty, 0.0)
                oc = _weights(s, rounded_p, vb).masked_fill(empty, 0.0)  # (Hkv, group, c, D)
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


def _weights(s: torch.Tensor, rounded_p, vb: torch.Tensor) -> torch.Tensor:
    """softmax(s) V, or with ``rounded_p`` as a flash kernel computes it: the unnormalised
    probabilities rounded to that dtype, P V in s's dtype, divided by their unrounded sum."""
    if rounded_p is None:
        return s.softmax(dim=-1) @ vb
    e = (s - s.amax(-1, keepdim=True)).exp()
    return (e.to(rounded_p).to(s.dtype) @ vb) / e.sum(-1, keepdim=True)


def _shift(mask, seq_q: int, seq_kv: int) -> int:
    """Position of query 0 among the keys: the mask's alignment (0 without a mask)."""
    return 0 if mask is None else mask.shift(seq_q, seq_kv)


def _hidden(mask, i, j, b, causal, shift) -> torch.Tensor:
    """True where key j is hidden from query i in batch row b: (c, Skv) for i (c, 1) and
    j (1, Skv): the mask layout's own rule, causal included (Bm, c, Skv), else causal alone."""
    layout = None if mask is None else mask.layout
    if layout is not None:
        hidden = layout.hidden(i, j, causal)
        return hidden[b if hidden.shape[0] > 1 else 0]
    return (j > i + shift) if causal else torch.zeros_like(i + j, dtype=torch.bool)


@dataclass(frozen=True)
class Magnitude:
    """How large a correct computation's rounding error can be at each element of one checked
    tensor (docs/method.md). ``m``: the magnitude, the tensor's shape, float64. ``terms``: how
    many nonzero terms the element's long sum adds (the keys a query sees for out and dq, the
    (query, head) pairs that see a key for dk and dv), broadcastable to ``m``. ``under``: the
    part of ``m`` from probabilities below the dtype's smallest normal number (stored with an
    absolute precision; float16 past about 16k keys), None when there is none. ``mod``: the
    random walk of the rounding a score modifier adds, P·G in place of W with G the grid its
    modified score (or its change) lands on where that is coarser than the raw score's
    (``coarser_grid``), None without a modifier. ``group`` (dk and dv of a GQA case): the
    random walk of a sum over the query heads of a kv head kept in the case dtype,
    sqrt(sum_k s_k^2) over its running sums s_k (``group_walk``), None elsewhere. ``scale``:
    the size of the element's terms without their rounding, |exact| + sqrt(sum P^2 V^2) (for
    the gradients A with P in place of W), which says whether the reference is (near) zero
    (None: ``m`` says it)."""

    m: torch.Tensor
    terms: torch.Tensor
    under: torch.Tensor | None = None
    mod: torch.Tensor | None = None
    group: torch.Tensor | None = None
    scale: torch.Tensor | None = None


def magnitude(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float,
    dout=None,
    mask=None,
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
            causal=causal,
            mask=mask,
            batch=b,
        )
        for b in range(q.shape[0])
    ]
    return [
        Magnitude(
            torch.cat([x.m for x in per_batch]),
            torch.cat([x.terms for x in per_batch]),
            *(
                _joined([getattr(x, part) for x in per_batch], [x.m for x in per_batch])
                for part in ("under", "mod", "group", "scale")
            ),
        )
        for per_batch in zip(*parts)  # one tensor's magnitudes, batch element by element
    ]


def _joined(parts: list, like: list) -> torch.Tensor | None:
    """Batch elements' optional parts as one tensor (zeros where an element has none); None
    when none has one."""
    if all(x is None for x in parts):
        return None
    return torch.cat([torch.zeros_like(m) if x is None else x for x, m in zip(parts, like)])


@dataclass
class _Chunk:
    """What a query chunk's random walks need beside their weights: the squared values (vv2:
    (1, Hq, Skv, D)), and with backward the gradient factor (|dP| + |delta|)·g of A = W·factor,
    the squared keys, the chunk's queries and its dout."""

    vv2: torch.Tensor
    factor: torch.Tensor | None = None  # (1, Hq, c, Skv)
    kk2: torch.Tensor | None = None  # (1, Hq, Skv, D)
    qc: torch.Tensor | None = None  # (1, Hq, c, D)
    doc: torch.Tensor | None = None  # (1, Hq, c, D)


class _Walk:
    """The random-walk size sqrt(sum of squared terms) of each checked tensor's sum for one
    choice of weights x in place of W (W itself, the part below the smallest normal number,
    the modifier's part), added chunk by chunk: out over keys (x²·V²), dq (scale²·(x·factor)²
    ·K²), dk and dv over the queries of every chunk. Nothing is allocated until some chunk
    has weights."""

    def __init__(self, q: torch.Tensor, seq_kv: int, scale: float, grads: bool):
        self.q, self.seq_kv, self.scale, self.grads = q, seq_kv, scale, grads
        self.out = self.dq = None  # (1, Hq, Sq, D) each; with dq, k2 and v2 (1, Hq, Skv, D)

    def add(self, rows: slice, x: torch.Tensor | None, c: _Chunk) -> None:
        if x is None:
            return
        if self.out is None:
            self.out = torch.zeros_like(self.q)
        self.out[:, :, rows] = (x.square() @ c.vv2).sqrt()
        if not self.grads:
            return
        if self.dq is None:
            kv = (*self.q.shape[:2], self.seq_kv, self.q.shape[-1])
            self.dq = torch.zeros_like(self.q)
            self.k2, self.v2 = (self.q.new_zeros(kv) for _ in range(2))
        a2 = (x * c.factor).square()
        self.dq[:, :, rows] = self.scale * (a2 @ c.kk2).sqrt()
        self.k2 += self.scale**2 * (a2.transpose(-1, -2) @ c.qc.square())
        self.v2 += x.square().transpose(-1, -2) @ c.doc.square()

    def sizes(self, per_kv) -> list:
        """[out, dq, dk, dv] (out alone without grads; None each when no chunk added any)."""
        if self.out is None:
            return [None] * (4 if self.grads else 1)
        if not self.grads:
            return [self.out]
        return [self.out, self.dq, per_kv(self.k2).sqrt(), per_kv(self.v2).sqrt()]


def _magnitude(q, k, v, *, scale, dout, causal, mask, batch) -> list[Magnitude]:
    B, Hq, Sq, D = q.shape
    Hkv, Skv, G = k.shape[1], k.shape[2], Hq // k.shape[1]
    f64, grads = torch.float64, dout is not None
    tiny = torch.finfo(q.dtype).tiny  # the case dtype's smallest normal number
    q, k, v = (t.detach().to(f64) for t in (q, k, v))
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)  # (B, Hq, Skv, D)
    do = dout.detach().to(f64) if grads else None
    walks = {part: _Walk(q, Skv, scale, grads) for part in ("all", "under", "mod", "plain")}
    out = torch.empty_like(q)  # the exact values, and with grads dq, dk, dv
    n_q = torch.empty(B, Hq, Sq, 1, dtype=f64, device=q.device)  # keys each query sees
    if grads:
        dq = torch.empty_like(q)
        dk, dv = (torch.zeros(B, Hq, Skv, D, dtype=f64, device=q.device) for _ in range(2))
        n_k = torch.zeros(B, Hq, Skv, 1, dtype=f64, device=q.device)  # queries seeing key j
    c = _Chunk(vv.square(), kk2=kk.square() if grads else None)
    step = max(1, CHUNK_BYTES // max(B * Hq * Skv * 8, 1))  # query rows per chunk
    j = torch.arange(Skv, device=q.device)[None, :]
    shift = _shift(mask, Sq, Skv)
    for start in range(0, Sq, step):
        rows = slice(start, min(start + step, Sq))
        c.qc = q[:, :, rows]
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
        s, size, added, g = _scores(c.qc, kk, i, j, scale, mask, (causal, shift, batch))
        kept, p = _probabilities(s)
        out[:, :, rows] = p @ vv
        n_q[:, :, rows] = kept.sum(-1, keepdim=True).to(f64)
        if grads:
            c.doc = do[:, :, rows]
            dp = c.doc @ vv.transpose(-1, -2)
            delta = (c.doc * out[:, :, rows]).sum(-1, keepdim=True)
            ds = p * (dp - delta) * g
            c.factor = (dp.abs() + delta.abs()) * g
            dq[:, :, rows] = scale * ds @ kk
            dk += scale * ds.transpose(-1, -2) @ c.qc
            dv += p.transpose(-1, -2) @ c.doc
            n_k += kept.sum(-2)[..., None].to(f64)
        low = kept & (p < tiny)  # stored with the absolute precision u * tiny, not u * p
        walks["all"].add(rows, _weighted(p, 1 + size), c)
        tinies = torch.where(low, tiny, torch.zeros_like(p)) if low.any() else None
        walks["under"].add(rows, tinies, c)
        walks["mod"].add(rows, None if added is None else _weighted(p, added), c)
        walks["plain"].add(rows, p, c)

    def per_kv(t):  # (B, Hq, Skv, X) -> (B, Hkv, Skv, X), summed over the group
        return t.view(B, Hkv, G, Skv, t.shape[-1]).sum(2)

    exact, terms, group = [out], [n_q], [None]
    if grads:
        exact, terms = [out, dq, per_kv(dk), per_kv(dv)], [n_q, n_q, per_kv(n_k), per_kv(n_k)]
        group = [None, None, *(group_walk(t, Hkv) for t in (dk, dv))]
    sizes = {part: walk.sizes(per_kv) for part, walk in walks.items()}
    return [
        Magnitude(_plus(x.abs() + walk, under), n, under, mod, grouped, x.abs() + plain)
        for x, n, grouped, walk, under, mod, plain in zip(exact, terms, group, *sizes.values())
    ]


def group_walk(per_head: torch.Tensor, kv_heads: int) -> torch.Tensor | None:
    """The random walk of adding a kv head's per-query-head gradients (B, Hq, Skv, D) in the
    case dtype, one head after another: sqrt(sum_k s_k^2) over the running sums s_k (B, Hkv,
    Skv, D); None without GQA (one query head per kv head: no such sum)."""
    B, Hq, Skv, D = per_head.shape
    if Hq == kv_heads:
        return None
    running = per_head.view(B, kv_heads, Hq // kv_heads, Skv, D).cumsum(2)
    return running.square().sum(2).sqrt()


def _scores(qc, kk, i, j, scale, mask, where):
    """Scores of query chunk qc (1, Hq, c, D) against kk (1, Hq, Skv, D), modified and masked
    (-inf), the size that sets their rounding error (|s|, or with a modifier |s| + |change|),
    the rounding grid the modifier adds (``coarser_grid``; None without one) and
    d(modified)/d(s) (1 without a modifier):
    (1, Hq, c, Skv) each. i (c, 1): the queries; j (1, Skv); ``where``: (causal, shift,
    batch row)."""
    causal, shift, batch = where
    s = (qc @ kk.transpose(-1, -2)) * scale  # (1, Hq, c, Skv)
    size, added, g = s.abs(), None, 1.0
    score_mod = None if mask is None else mask.score_mod
    if score_mod is not None:
        heads = torch.arange(s.shape[1], device=s.device)[None, :, None, None]
        raw = s.detach().requires_grad_()
        with torch.enable_grad():
            modded = score_mod.reference(raw, heads, i + shift, j)
            (g,) = torch.autograd.grad(modded.sum(), raw)
        s = modded.detach()
        change = s - raw.detach()
        size = raw.detach().abs() + change.abs()
        added = coarser_grid(raw.detach(), s, change)
    return s.masked_fill(_hidden(mask, i, j, batch, causal, shift), -math.inf), size, added, g


def grid(x: torch.Tensor) -> torch.Tensor:
    """The spacing unit of the binade each value lies in, 2^floor(log2 |x|) (0 at 0): a float
    of unit roundoff u stores x with an error up to u times this, so a value just above a power
    of two rounds twice as coarsely as one just below it."""
    mantissa, exponent = torch.frexp(x.abs())  # |x| = mantissa 2^exponent, mantissa in [0.5, 1)
    return torch.where(mantissa > 0, torch.ldexp(torch.ones_like(x), exponent - 1), 0.0)


def coarser_grid(raw: torch.Tensor, modded: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
    """The rounding a score modifier adds, in units of u: the grid of the modified score or of
    the change itself, whichever is coarser, where it is coarser than the raw score's (whose
    rounding the rule's constants already cover); zero where the modifier leaves the score on
    its own grid or a finer one (a soft-cap). Same shape as the scores."""
    landed = torch.maximum(grid(modded), grid(change))
    return torch.where(landed > grid(raw), landed, torch.zeros_like(landed))


def _probabilities(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From masked scores s (B, Hq, c, Skv): the kept pairs and the probabilities p (rows
    with no key: zero), each (B, Hq, c, Skv)."""
    kept = ~s.isneginf()
    empty = ~kept.any(-1, keepdim=True)  # queries with no key: output zero
    p = s.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
    return kept, p


def _weighted(p: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """p · size where p > 0 (a masked pair's size may be anything), zero elsewhere: W = P (1 +
    |S|) for size 1 + |S|."""
    return torch.where(p > 0, p * size, torch.zeros_like(p))


def _plus(m: torch.Tensor, under: torch.Tensor | None) -> torch.Tensor:
    """A magnitude with its under part added, where there is one."""
    return m if under is None else m + under
