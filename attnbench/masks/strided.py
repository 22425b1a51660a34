"""Mask strided (Sparse Transformer's strided pattern, by blocks): query block a keeps key
block c if |a - c| < stride (the local band) or (a - c) % stride == 0 (every stride-th
block)."""

from attnbench.masks.blocks import BlockKind, BlockLayout, sparsity_params
from attnbench.masks.kind import register_kind


class Strides(BlockLayout):
    kind = "strided"

    def __init__(self, seq_len, batch, block, stride):
        super().__init__(seq_len, batch, block)
        self.stride = stride

    def blocks(self, a, c):
        return ((a - c).abs() < self.stride) | ((a - c) % self.stride == 0)

    def hidden(self, i, j, causal):
        qb, kb = i // self.block, j // self.block  # (c, 1), (1, Skv)
        near = (qb - kb).abs() < self.stride
        out = ~(near | ((qb - kb) % self.stride == 0))
        return (out | (j > i))[None] if causal else out[None]


class Strided(BlockKind):
    name = "strided"
    meaning = "Sparse Transformer's strided pattern (--sparsity)"
    defaults = {"block": 64, "stride": 4}

    def layout(self, case, seed):
        p = sparsity_params(case.pattern)
        return Strides(case.seq_q, case.batch, p["block"], p["stride"])


register_kind(Strided())
