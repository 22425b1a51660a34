"""Mask padding (key padding): batch row b has ``kv_lens[b]`` valid keys, keys j >= kv_lens[b]
are masked. The lengths are drawn from the seed (run/inputs.py key_lengths, stream
"padding"), uniform in [1, Skv]; the reference hides j >= kv_lens[b] on its own."""

from attnbench.masks.interval import IntervalKind
from attnbench.masks.kind import register_kind


class Padding(IntervalKind):
    name = "padding"
    meaning = "per-batch valid key lengths"

    def pairs(self, case, kv_lens, layout) -> int:
        if kv_lens is None:
            raise ValueError("mask=padding: the pair count needs kv_lens")
        return super().pairs(case, kv_lens, layout)


register_kind(Padding())
