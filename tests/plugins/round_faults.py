"""Impls that pass their check and then fail inside the timing rounds, for the round tests:
each counts its calls in the process, and from its ROUND_FAULT_CALL-th call on (past the
check's one call, inside the first round's warm-up) g_abort aborts its process and g_hang
hangs. Until then both are SDPA."""

import os
import time

import torch

from attnbench.registry import register

ROUND_FAULT_CALL = 3
_calls = {"g_abort": 0, "g_hang": 0}


def _counted(name: str) -> bool:
    _calls[name] += 1
    return _calls[name] >= ROUND_FAULT_CALL


def _sdpa(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@register("g_abort")
def g_abort(q, k, v, *, causal, scale):
    if _counted("g_abort"):
        os.write(2, b"planted abort in the rounds\n")
        os.abort()
    return _sdpa(q, k, v, causal, scale)


@register("g_hang")
def g_hang(q, k, v, *, causal, scale):
    if _counted("g_hang"):
        time.sleep(3600)
    return _sdpa(q, k, v, causal, scale)
