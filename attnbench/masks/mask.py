"""The object an impl that declares masks (or score modifiers) receives as ``mask=``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.masks.kind import Layout
from attnbench.masks.rules import block_keep, offset
from attnbench.masks.scores import ScoreMod


@dataclass
class Mask:
    """The kind (masks.KINDS), the window width (kind window), the valid key lengths kv_lens
    (B,) int64 on the case's device (kind padding), the causal alignment ``align``
    (rules.ALIGNS), the kind's ``pattern`` (a kind.Layout, for kinds that have one) and the
    case's score modifier ``score_mod`` (a scores.ScoreMod, or None). Dense and block masks
    are built once per row and cached here, outside the timed calls, as a model builds them
    once for all its layers."""

    kind: str = "none"
    window: int | None = None
    kv_lens: torch.Tensor | None = None  # (B,)
    align: str = "top_left"
    pattern: Layout | None = None  # kinds with a layout (document, block_sparse, ...)
    score_mod: ScoreMod | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def fresh(self) -> Mask:
        """The same mask with an empty cache (one per row: caches die with the row)."""
        return Mask(self.kind, self.window, self.kv_lens, self.align, self.pattern, self.score_mod)

    def masked(self, causal: bool) -> bool:
        """Whether any key is masked beyond nothing at all."""
        return causal or self.kind != "none"

    def shift(self, seq_q: int, seq_kv: int) -> int:
        """Position of query 0 among the keys (rules.offset)."""
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

    def positions(self, heads: int, seq_q: int, seq_kv: int, device):
        """What a score modifier's ``apply(s, h, p, j)`` takes beside s, cached: the query head
        h (1, Hq, 1, 1), the query's position among the keys p (Sq, 1), the key j (1, Skv)."""

        def make():
            h = torch.arange(heads, device=device)[None, :, None, None]
            p = torch.arange(seq_q, device=device)[:, None] + self.shift(seq_q, seq_kv)
            return h, p, torch.arange(seq_kv, device=device)[None, :]

        return self.cached(("positions", heads, seq_q, seq_kv, str(device)), make)

    def cached(self, key: tuple, make):
        """Any other per-row object (e.g. a flex block mask), made once by ``make()``."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
