"""Where the keys a query keeps lie for the interval masks (none, padding, window, each with
or without causal), as geometry impls share: query i at position p = i + shift among the keys
keeps one interval ``lo <= j < hi``. shift is 0 with ``causal_align`` top_left (SDPA's
``is_causal``) and Skv - Sq with bottom_right (FlashAttention >= 2.1, a decoder whose Sq new
tokens follow Skv - Sq cached ones):

    none    + causal   : j <= p
    padding            : j < kv_lens[b]
    padding + causal   : j <= p and j < kv_lens[b]
    window             : |p - j| < W            (symmetric: 2W - 1 keys around p)
    window  + causal   : p - W < j <= p         (sliding window: W keys ending at p)

Bottom-right with Sq > Skv leaves the first Sq - Skv queries without a key: their output is
zero (FlashAttention's convention), and so are their gradients. The float64 reference
(measure/reference.py, with each kind's ``hidden``) writes these rules out element by element
on its own, so a mistake here is caught there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


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
    hi = (i + ahead).minimum(kv_len)
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
        rows.new_tensor(seq_kv)  # rows' dtype (int64) and device
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
    import torch

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
