"""Score modifier alibi (ALiBi, Press et al. 2022; BLOOM, MPT): s -> s - m_h · |p - j|, a
linear penalty on the distance between query position p and key j, with one slope m_h per
query head: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n heads a power of two, and
for other n the n' = 2^floor(log2 n) slopes of n' heads followed by every other slope of 2n'
heads (the paper's code, as BLOOM has it). Causal, it is the paper's m·(j - p); without causal
the distance is symmetric. ``--score-mod alibi``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnbench.masks.scores import ScoreMod, register_mod

if TYPE_CHECKING:
    import torch


@register_mod
class Alibi(ScoreMod):
    name = "alibi"
    short = "ali"
    meaning = "ALiBi: s - m_h |p - j|, slopes per head as BLOOM's"
    additive = True

    def __init__(self, arg, heads, device="cpu"):
        import torch

        super().__init__(arg, heads, device)
        n = 2 ** int(math.log2(heads))
        first = torch.pow(2.0, -8.0 * torch.arange(1, n + 1) / n)
        rest = torch.pow(2.0, -4.0 * (2 * torch.arange(heads - n) + 1) / n)
        self.slopes = torch.cat([first, rest]).to(device)  # (heads,) float32

    def bias(self, h, p, j):
        return -self.slopes[h] * (p - j).abs()

    def apply(self, s, h, p, j):
        return s + self.bias(h, p, j).to(s.dtype)

    def reference(self, s, h, p, j):
        return s - self.reference_slopes(s)[h] * (p - j).abs().to(s.dtype)

    def reference_slopes(self, like: torch.Tensor) -> torch.Tensor:
        """The slopes written out from the paper's rule, one head at a time."""
        import torch

        power = 1
        while power * 2 <= self.heads:
            power *= 2
        out = [2 ** (-8 * (k + 1) / power) for k in range(power)]
        out += [2 ** (-8 * (2 * k + 1) / (2 * power)) for k in range(self.heads - power)]
        return torch.tensor(out, dtype=like.dtype, device=like.device)
