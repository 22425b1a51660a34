"""A correct impl that takes a while per call, so a sweep can be killed part way through."""

import time

import torch

from attnbench.registry import register


@register("slow")
def slow(q, k, v, *, causal, scale):
    time.sleep(0.02)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
