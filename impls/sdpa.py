"""torch.nn.functional.scaled_dot_product_attention with PyTorch's own backend choice."""
import torch.nn.functional as F

from attnbench.registry import register


@register("sdpa", description="F.scaled_dot_product_attention, default backend choice")
def sdpa(q, k, v, *, causal, scale):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); is_causal is top-left aligned
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])
