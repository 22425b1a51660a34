"""Mask none: every key, or with causal the keys up to the query's position (rules.py)."""

from attnbench.masks.interval import IntervalKind, causal_pairs
from attnbench.masks.kind import register_kind


class NoMask(IntervalKind):
    name = "none"
    meaning = "no mask beyond causal"

    def pairs(self, case, layout) -> int:
        if not case.causal:
            return case.batch * case.seq_q * case.seq_kv
        return case.batch * causal_pairs(case.seq_q, case.seq_kv, case.shift)

    def label(self, case) -> str:
        return ""


register_kind(NoMask())
