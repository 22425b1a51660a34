"""Impls that fail on one case each of the smoke grid, for the Ray executor's tests: r_kill
kills its own process (SIGKILL: no handler runs, nothing is written) on the causal case with
backward; r_hang hangs on the full (non-causal) forward-only case. Elsewhere both are SDPA."""

import os
import signal
import time

import torch

from attnbench.registry import register


def _sdpa(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@register("r_kill")
def r_kill(q, k, v, *, causal, scale):
    if causal and q.requires_grad:
        os.kill(os.getpid(), signal.SIGKILL)
    return _sdpa(q, k, v, causal, scale)


@register("r_hang")
def r_hang(q, k, v, *, causal, scale):
    if not causal and not q.requires_grad:
        time.sleep(3600)
    return _sdpa(q, k, v, causal, scale)
