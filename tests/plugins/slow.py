"""A correct impl that takes a while per call (ATTNBENCH_SLOW_S seconds, default 0.02), so a
sweep can be killed part way through."""

import os
import time

import torch

from attnbench.registry import register


@register("slow")
def slow(q, k, v, *, causal, scale):
    time.sleep(float(os.environ.get("ATTNBENCH_SLOW_S", "0.02")))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
