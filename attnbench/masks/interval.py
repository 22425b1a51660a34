"""What the interval kinds (none, padding, window) share: their pair count, from rules.py's
geometry (one interval of keys per query) and the case's window and key lengths."""

from __future__ import annotations

import torch

from attnbench.masks.kind import MaskKind
from attnbench.masks.rules import key_bounds


def causal_pairs(seq_q: int, seq_kv: int, shift: int = 0) -> int:
    """Number of (query, key) pairs a causal mask leaves unmasked when query i sees keys
    j <= i + shift (shift 0: top-left; Skv - Sq: bottom-right)."""
    # row i sees clamp(i + shift + 1, 0, seq_kv) keys: rows below -shift see none, rows from
    # seq_kv - shift - 1 on see all of them, the rows between a run 1, 2, ...
    first = min(max(-shift, 0), seq_q)  # rows that see no key
    last = min(max(seq_kv - shift - 1, first), seq_q)  # rows [first, last) see i + shift + 1
    ramp = sum_range(first + shift + 1, last + shift + 1)
    return ramp + (seq_q - last) * seq_kv


def sum_range(a: int, b: int) -> int:
    """a + (a + 1) + ... + (b - 1), 0 when b <= a."""
    return (b - a) * (a + b - 1) // 2 if b > a else 0


class IntervalKind(MaskKind):
    """A kind whose kept keys are one interval per query (rules.py)."""

    def pairs(self, case, kv_lens, layout) -> int:
        lo, hi = key_bounds(
            torch.arange(case.seq_q),
            case.seq_kv,
            causal=case.causal,
            window=case.window,
            kv_lens=None if kv_lens is None else torch.tensor(kv_lens),
            shift=case.shift,
        )
        counts = (hi - lo).clamp(min=0).sum()  # over (Bm, Sq)
        return int(counts) * (1 if kv_lens is not None else case.batch)
