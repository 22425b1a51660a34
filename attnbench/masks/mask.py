"""The object an impl that declares masks (or score modifiers) receives as ``mask=``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnbench.masks.interval import Interval
from attnbench.masks.kind import Layout
from attnbench.masks.rules import offset
from attnbench.masks.scores import ScoreMod

if TYPE_CHECKING:
    import torch


@dataclass
class Mask:
    """The kind (masks.KINDS), its drawn ``layout`` (a kind.Layout; None: no mask beyond
    causal), the causal alignment ``align`` (rules.ALIGNS) and the case's score modifier
    ``score_mod`` (a scores.ScoreMod, or None). Dense and block masks are built once per row
    and cached here, outside the timed calls, as a model builds them once for all its layers.

    What impls read of an interval kind (none, padding, window) they may read from the
    geometry of rules.py: ``window`` (W, or None) and ``kv_lens`` ((B,) int64 on the case's
    device, or None); ``pattern`` is the layout of any other kind (document, block_sparse,
    a plugin's), else None."""

    kind: str = "none"
    layout: Layout | None = None
    align: str = "top_left"
    score_mod: ScoreMod | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def fresh(self) -> Mask:
        """The same mask with an empty cache (one per row: caches die with the row)."""
        return Mask(self.kind, self.layout, self.align, self.score_mod)

    @property
    def window(self) -> int | None:
        return self.layout.window if isinstance(self.layout, Interval) else None

    @property
    def kv_lens(self) -> torch.Tensor | None:
        return self.layout.kv_lens if isinstance(self.layout, Interval) else None

    @property
    def pattern(self) -> Layout | None:
        return None if isinstance(self.layout, Interval) else self.layout

    def masked(self, causal: bool) -> bool:
        """Whether any key is masked beyond nothing at all."""
        return causal or self.kind != "none"

    def shift(self, seq_q: int, seq_kv: int) -> int:
        """Position of query 0 among the keys (rules.offset)."""
        return offset(self.align, seq_q, seq_kv)

    def keep(self, seq_q: int, seq_kv: int, causal: bool, device) -> torch.Tensor:
        """Dense boolean mask, True = attend: (Bm, 1, Sq, Skv), cached."""
        layout = self.layout or Interval(seq_q, seq_kv, 1, self.shift(seq_q, seq_kv))
        return self.cached(
            ("keep", seq_q, seq_kv, causal, str(device)), lambda: layout.dense(causal, device)
        )

    def positions(self, heads: int, seq_q: int, seq_kv: int, device):
        """What a score modifier's ``apply(s, h, p, j)`` takes beside s, cached: the query head
        h (1, Hq, 1, 1), the query's position among the keys p (Sq, 1), the key j (1, Skv)."""

        def make():
            import torch

            h = torch.arange(heads, device=device)[None, :, None, None]
            p = torch.arange(seq_q, device=device)[:, None] + self.shift(seq_q, seq_kv)
            return h, p, torch.arange(seq_kv, device=device)[None, :]

        return self.cached(("positions", heads, seq_q, seq_kv, str(device)), make)

    def cached(self, key: tuple, make):
        """Any other per-row object (e.g. a flex block mask), made once by ``make()``."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
