"""One version of a kernel, for an A/B check in one interleaved run (docs/reports.md,
"A/B in one run"): the textbook formula, registered as ``ab_old``."""

import torch

from attnbench.impls.naive import formula
from attnbench.registry import register


@register("ab_old", description="A/B example: the textbook formula")
def ab_old(q, k, v, *, causal, scale):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D); causal top-left aligned
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril() if causal else None
    return formula(q, k, v, keep, scale)
