"""What the interval kinds (none, padding, window, and any plugin of that shape) share: a
layout whose kept keys are one interval per query (rules.py's geometry), its reference rule
written out apart from that geometry, and its exact pair count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.masks.kind import Layout, MaskKind
from attnbench.masks.rules import interval, key_bounds, reach

if TYPE_CHECKING:
    import torch


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


class Interval(Layout):
    """Query i, at position p = i + shift among the keys, keeps the keys lo <= j < hi that the
    window W (None: unbounded) and the valid key lengths kv_lens (B,) int64 (None: all Skv)
    leave it, causal combined (rules.py). Cross-attention shapes (Sq != Skv) are allowed."""

    kind = "interval"

    def __init__(
        self,
        seq_q: int,
        seq_kv: int,
        batch: int,
        shift: int = 0,
        *,
        window: int | None = None,
        kv_lens: torch.Tensor | None = None,
    ):
        super().__init__(seq_q, batch)
        self.seq_q, self.seq_kv, self.shift = seq_q, seq_kv, shift
        self.window, self.kv_lens = window, kv_lens

    @property
    def rows(self) -> int:
        return 1 if self.kv_lens is None else self.batch

    def moved(self, delta: int = 0, widen: int = 0) -> Interval | None:
        """The same keys with query positions moved by ``delta`` and the window widened by
        ``widen`` (a diagnosis's near misses); None where the window would be empty."""
        window = None if self.window is None else self.window + widen
        if window is not None and window < 1:
            return None
        return Interval(
            self.seq_q,
            self.seq_kv,
            self.batch,
            self.shift + delta,
            window=window,
            kv_lens=self.kv_lens,
        )

    def bounds(self, rows: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """For query rows (n,): lo (1, n), hi (Bm, n) (rules.key_bounds)."""
        return key_bounds(
            rows,
            self.seq_kv,
            causal=causal,
            window=self.window,
            kv_lens=self.kv_lens,
            shift=self.shift,
        )

    def rule(self, b, i, j, causal):
        import torch

        back, ahead = reach(causal, self.window)
        lens = self.kv_lens
        kv_len = torch.tensor(self.seq_kv) if lens is None else lens.to(i.device)[b]
        lo, hi = interval(i + self.shift, back=back, ahead=ahead, kv_len=kv_len)
        return (j >= lo) & (j < hi)

    def hidden(self, i, j, causal):
        import torch

        p = i + self.shift  # (c, 1): the queries' positions among the keys
        drop = torch.zeros(p.shape[0], j.shape[1], dtype=torch.bool, device=p.device)
        if causal:
            drop |= j > p
        if self.window is not None:
            drop |= (p - j >= self.window) if causal else ((p - j).abs() >= self.window)
        if self.kv_lens is None:
            return drop[None]
        return drop | (j >= self.kv_lens.to(p.device)[:, None, None])  # (B, c, Skv)

    def dense(self, causal, device) -> torch.Tensor:
        make = lambda: self.keep(0, self.seq_q, 0, self.seq_kv, causal, device)[:, None]
        return self.cached(("dense", causal, str(device)), make)

    def draws(self) -> dict:
        return {} if self.kv_lens is None else {"key_lengths": self.kv_lens.tolist()}

    def pairs(self, causal: bool) -> int:
        import torch

        lo, hi = self.bounds(torch.arange(self.seq_q), causal)
        counts = (hi - lo).clamp(min=0).sum()  # over (Bm, Sq)
        return int(counts) * (self.batch // self.rows)


class IntervalKind(MaskKind):
    """A kind whose kept keys are one interval per query: an ``Interval`` layout built from
    the case (its alignment, and what ``limits`` adds: a window, key lengths)."""

    def limits(self, case, seed: int) -> dict:
        """The layout's window and kv_lens for ``case``, drawn from ``seed`` where drawn."""
        return {}

    def layout(self, case, seed):
        return self.interval(case, **self.limits(case, seed))

    @staticmethod
    def interval(case, **limits) -> Interval:
        """The case's ``Interval`` with ``limits`` (window=, kv_lens=)."""
        return Interval(case.seq_q, case.seq_kv, case.batch, case.shift, **limits)
