"""A plugin's score modifier that raises each key by up to K: s + K * frac(hash(h, j)), a
per-(head, key) bias in [0, K] (``--plugin ramp.py --score-mod ramp:17``). At K just above a
power of two the dominant scores land on the coarser grid of their binade; SDPA takes the bias
as a float mask in q's dtype, so each key's bias is rounded once for every query."""

import torch

from attnbench.masks import ScoreMod, register_mod


@register_mod
class Ramp(ScoreMod):
    name = "ramp"
    meaning = "s + K * frac(hash(h, j)) (ramp:K)"
    default_arg = "20"
    additive = True

    def __init__(self, arg, heads, device="cpu"):
        super().__init__(arg, heads, device)
        self.K = float(arg)

    @classmethod
    def canonical(cls, arg):
        return f"{float(arg):g}"

    def bias(self, h, p, j):
        return self.K * (((j * 7919 + h * 104729) % 997).to(torch.float32) / 996.0) + 0 * p

    def apply(self, s, h, p, j):
        return s + self.bias(h, p, j).to(s.dtype)

    def reference(self, s, h, p, j):
        frac = ((j.to(torch.int64) * 7919 + h.to(torch.int64) * 104729) % 997).to(s.dtype) / 996.0
        return s + self.K * frac + 0 * p.to(s.dtype)
