"""Mask prefix_lm (a prefix LM, as T5's and UniLM's, attention-gym's ``prefix_lm``): the
first P positions are a bidirectional prefix, the rest is causal. Query i keeps key j if
j < P or j <= i; self-attention, causal only. The spec is P in positions (``--mask
prefix_lm:128``) or in percent of S (``prefix_lm:25%``, the default)."""

from __future__ import annotations

from attnbench.masks.interval import sum_range
from attnbench.masks.kind import Layout, MaskKind, register_kind


class Prefix(Layout):
    kind = "prefix_lm"

    def __init__(self, seq_len: int, batch: int, prefix: int):
        super().__init__(seq_len, batch)
        self.prefix = prefix  # P, at most S

    def rule(self, b, i, j, causal):
        return (j < self.prefix) | (j <= i)

    def hidden(self, i, j, causal):
        past_prefix = j >= self.prefix  # (1, Skv)
        ahead = j > i  # (c, Skv)
        return (past_prefix & ahead)[None]

    def pairs(self, causal: bool) -> int:
        # rows i < P see the whole prefix (P keys), later rows keys 0..i (i + 1 keys)
        P, S = self.prefix, self.seq_len
        return self.batch * (P * P + sum_range(P + 1, S + 1))


class PrefixLM(MaskKind):
    name = "prefix_lm"
    meaning = "causal with a bidirectional prefix (--mask prefix_lm:P or prefix_lm:PCT%)"
    default_spec = "25%"
    spec_flag = "--mask prefix_lm:"
    self_only = True
    needs_causal = True

    def canonical(self, spec):
        text = (self.default_spec if spec is None else str(spec)).strip()
        number = text[:-1] if text.endswith("%") else text
        if number.isdigit() and int(number) > 0 and (text == number or int(number) <= 100):
            return text if text != number else str(int(number))
        raise ValueError(
            f"{text!r} is not a prefix length (give P, positions, or PCT%, 1-100 percent of "
            f"the sequence; e.g. --mask prefix_lm:128 or prefix_lm:25%)"
        )

    def prefix(self, case) -> int:
        spec = case.pattern
        if spec.endswith("%"):
            return case.seq_q * int(spec[:-1]) // 100
        return min(int(spec), case.seq_q)

    def layout(self, case, seed):
        return Prefix(case.seq_q, case.batch, self.prefix(case))


register_kind(PrefixLM())
