"""torch.nn.functional.scaled_dot_product_attention with PyTorch's own backend choice; the
backend column says which one ran (attnbench/sdpa.py finds out with the profiler)."""
from attnbench import sdpa as sdpa_call
from attnbench.masks import MASKS
from attnbench.registry import register


@register("sdpa", masks=MASKS, backend=sdpa_call.detect_backend,
          description="F.scaled_dot_product_attention, default backend choice")
def sdpa(q, k, v, *, causal, scale, mask):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D)
    return sdpa_call.attention(q, k, v, causal=causal, scale=scale, mask=mask)
