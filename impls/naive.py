"""The textbook formula, eager: softmax(Q K^T · scale) V, materialising the full score matrix."""
import torch

from attnbench.registry import register


@register("naive", description="softmax(QK^T*scale)V in eager PyTorch; materialises the "
                               "(Sq, Skv) score matrix")
def naive(q, k, v, *, causal, scale):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-2, -1)) * scale  # (B, Hq, Sq, Skv)
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(dim=-1) @ v  # (B, Hq, Sq, D)
