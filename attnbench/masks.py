"""The masks an impl may be asked for, and the object it receives as ``mask=``.

A mask is a case dimension next to ``causal``: ``none``, ``padding`` (key padding: batch b has
``kv_lens[b]`` valid keys, keys j >= kv_lens[b] are masked) or ``window`` (local attention,
width W). ``causal`` is its own boolean and combines with every mask. In the rules below p is
the query's position among the keys: p = i with ``causal_align`` top_left (SDPA's
``is_causal``), p = i + Skv - Sq with bottom_right (FlashAttention >= 2.1, a decoder whose
Sq new tokens follow Skv - Sq cached ones):

    none    + causal   : j <= p
    padding            : j < kv_lens[b]
    padding + causal   : j <= p and j < kv_lens[b]
    window             : |p - j| < W            (symmetric: 2W - 1 keys around p)
    window  + causal   : p - W < j <= p         (sliding window: W keys ending at p)

Bottom-right with Sq > Skv leaves the first Sq - Skv queries without a key: their output is
zero (FlashAttention's convention), and so are their gradients.

Every rule keeps, for query i, one interval of keys ``lo <= j < hi``; ``key_bounds`` computes
it. Impls use these helpers; the float64 reference (measure/reference.py) writes the rules out
element by element on its own, so a mistake here is caught there.

Packed documents (``document``) and sparse patterns (``block_sparse``, ``strided``) depend on
data drawn from the seed; their rules are in attnbench/patterns.py, and ``Mask.pattern``
holds the draw (``Mask.keep`` gives their dense form like the others').
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.patterns import PATTERN_MASKS, Pattern

MASKS = ("none", "padding", "window", *PATTERN_MASKS)  # the last three: patterns.py
ALIGNS = ("top_left", "bottom_right")  # where the causal diagonal (and a window) sits
FAR = 1 << 30  # "unbounded" for a window side, small enough for int32 index arithmetic


def reach(causal: bool, window: int | None) -> tuple[int, int]:
    """(back, ahead): query i keeps keys i - back < j < i + ahead (before padding)."""
    back = FAR if window is None else window
    ahead = 1 if causal else (FAR if window is None else window)
    return back, ahead


def interval(i, *, back, ahead, kv_len):
    """The keys query ``i`` keeps, ``lo <= j < hi``, elementwise for tensors of query indices
    (``back``, ``ahead``, ``kv_len`` broadcast against ``i``). May be empty (hi <= lo). Written
    without branches, so it also serves as a FlexAttention mask_mod body."""
    lo = (i - back + 1).clamp(min=0)
    hi = torch.minimum(i + ahead, kv_len)
    return lo, hi


def offset(align: str, seq_q: int, seq_kv: int) -> int:
    """Position of query 0 among the keys: 0 top-left, Skv - Sq bottom-right."""
    return seq_kv - seq_q if align == "bottom_right" else 0


def key_bounds(
    rows: torch.Tensor,
    seq_kv: int,
    *,
    causal: bool,
    window: int | None = None,
    kv_lens: torch.Tensor | None = None,
    shift: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For query rows ``rows`` (n,): lo (1, n), hi (Bm, n), Bm = B with key padding else 1.
    ``shift``: the position of query 0 among the keys (``offset``)."""
    back, ahead = reach(causal, window)
    kv_len = (
        torch.tensor(seq_kv, device=rows.device)
        if kv_lens is None
        else kv_lens.to(rows.device)[:, None]
    )  # () or (B, 1)
    return interval(rows[None, :] + shift, back=back, ahead=ahead, kv_len=kv_len)


def block_keep(
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    seq_kv: int,
    *,
    causal: bool,
    window: int | None = None,
    kv_lens: torch.Tensor | None = None,
    device=None,
    shift: int = 0,
) -> torch.Tensor:
    """Boolean mask of the block rows q0..q1-1, keys k0..k1-1, True = attend: (Bm, bq, bk)."""
    lo, hi = key_bounds(
        torch.arange(q0, q1, device=device),
        seq_kv,
        causal=causal,
        window=window,
        kv_lens=kv_lens,
        shift=shift,
    )
    j = torch.arange(k0, k1, device=device)
    return (j >= lo[..., None]) & (j < hi[..., None])


@dataclass
class Mask:
    """What an impl that declares mask support gets as ``mask=``: the kind, the window width
    (kind window), the valid key lengths kv_lens (B,) int64 on the case's device (kind
    padding), the causal alignment ``align`` (ALIGNS). Dense and block masks are built once per
    row and cached here, outside the timed calls, as a model builds them once for all its
    layers."""

    kind: str = "none"
    window: int | None = None
    kv_lens: torch.Tensor | None = None  # (B,)
    align: str = "top_left"
    pattern: Pattern | None = None  # kinds document, block_sparse, strided (patterns.py)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def fresh(self) -> Mask:
        """The same mask with an empty cache (one per row: caches die with the row)."""
        return Mask(self.kind, self.window, self.kv_lens, self.align, self.pattern)

    def masked(self, causal: bool) -> bool:
        """Whether any key is masked beyond nothing at all."""
        return causal or self.kind != "none"

    def shift(self, seq_q: int, seq_kv: int) -> int:
        """Position of query 0 among the keys (``offset``)."""
        return offset(self.align, seq_q, seq_kv)

    def keep(self, seq_q: int, seq_kv: int, causal: bool, device) -> torch.Tensor:
        """Dense boolean mask, True = attend: (Bm, 1, Sq, Skv), cached."""
        key = ("keep", seq_q, seq_kv, causal, str(device))
        if self.pattern is not None:
            return self.cached(key, lambda: self.pattern.dense(causal, device))
        return self.cached(
            key,
            lambda: block_keep(
                0,
                seq_q,
                0,
                seq_kv,
                seq_kv,
                causal=causal,
                window=self.window,
                kv_lens=self.kv_lens,
                device=device,
                shift=self.shift(seq_q, seq_kv),
            )[:, None],
        )

    def cached(self, key: tuple, make):
        """Any other per-row object (e.g. a flex block mask), made once by ``make()``."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
