"""The other version of ab_old.py: the same code plus a quarter of its work again (the first
quarter of the queries attended twice and averaged with themselves, in the forward and the
backward), so about 1.25x slower: a planted slowdown an A/B run must find."""

import torch

from attnbench.impls.naive import formula
from attnbench.registry import register


@register("ab_new", description="A/B example: ab_old plus a quarter of its work again")
def ab_new(q, k, v, *, causal, scale):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D); causal top-left aligned
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril() if causal else None
    out = formula(q, k, v, keep, scale)
    n = q.shape[-2] // 4
    again = formula(q[:, :, :n], k, v, None if keep is None else keep[:n], scale)
    return torch.cat([(out[:, :, :n] + again) * 0.5, out[:, :, n:]], dim=2)
