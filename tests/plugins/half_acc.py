"""A plugin impl that keeps its running output in the input's half type: an online-softmax
attention over 64-key tiles whose accumulator is rounded to bfloat16 or float16 after every
tile (scores, maxima and sums in float32). The mistake of a kernel that should accumulate in
float32: its verdict passes on short rows, and its precision figure flags it
(``--plugin half_acc.py --impls half_acc``)."""

import math

import torch

from attnbench import register

TILE = 64  # keys per tile: the accumulator is rounded once per tile


def half_acc_attention(q, k, v, causal, scale, tile=TILE):
    """q (B, H, Sq, D), k and v (B, Hkv, Skv, D): out (B, H, Sq, D) in q's dtype, causal
    top-left."""
    B, H, Sq, D = q.shape
    group, Skv = H // k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    m = torch.full((B, H, Sq, 1), -math.inf, device=q.device)  # running max, float32
    l = torch.zeros((B, H, Sq, 1), device=q.device)  # running sum, float32  # noqa: E741
    acc = torch.zeros((B, H, Sq, D), dtype=q.dtype, device=q.device)  # the mistake: half type
    i = torch.arange(Sq, device=q.device)[:, None]
    for start in range(0, Skv, tile):
        stop = min(start + tile, Skv)
        s = (q.float() @ k[:, :, start:stop].float().transpose(-1, -2)) * scale
        if causal:
            j = torch.arange(start, stop, device=q.device)[None, :]
            s = s.masked_fill(j > i, -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new).nan_to_num(0.0)
        p = torch.exp(s - m_new).nan_to_num(0.0)
        l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
        pv = p.to(q.dtype).float() @ v[:, :, start:stop].float()
        acc = (acc.float() * alpha + pv).to(q.dtype)
        m = m_new
    return (acc.float() / l).to(q.dtype)


@register("half_acc", dtypes=("float16", "bfloat16"), gqa=True, backward=False)
def half_acc(q, k, v, *, causal, scale):
    return half_acc_attention(q, k, v, causal, scale)
