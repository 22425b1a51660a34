"""Impls that end their process on purpose at seq_q 128 (elsewhere SDPA): x_os_exit with
os._exit(0) (a success, for the shell), x_sys_exit with sys.exit(3); for --no-isolate."""

import os
import sys

import torch

from attnbench.registry import register


def _sdpa(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@register("x_os_exit")
def x_os_exit(q, k, v, *, causal, scale):
    if q.shape[2] == 128:
        os._exit(0)
    return _sdpa(q, k, v, causal, scale)


@register("x_sys_exit")
def x_sys_exit(q, k, v, *, causal, scale):
    if q.shape[2] == 128:
        sys.exit(3)
    return _sdpa(q, k, v, causal, scale)
