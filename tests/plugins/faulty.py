"""Impls that misbehave on purpose, one way each, for the fault-injection tests."""

import os
import time

import torch

from attnbench.registry import register


def _ok(q, k, v, causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@register("f_raise")
def f_raise(q, k, v, *, causal, scale):
    raise ValueError("planted failure in f_raise")


@register("f_nan")
def f_nan(q, k, v, *, causal, scale):
    out = _ok(q, k, v, causal, scale)
    return out + torch.where(
        torch.arange(out.numel(), device=out.device).view(out.shape) == 5, float("nan"), 0.0
    )


@register("f_shape")
def f_shape(q, k, v, *, causal, scale):
    return _ok(q, k, v, causal, scale)[:, :, :-1]


@register("f_oom")
def f_oom(q, k, v, *, causal, scale):
    if q.shape[2] >= 128:  # "runs out of memory" from seq 128 up
        raise torch.OutOfMemoryError("planted: tried to allocate 64.00 GiB")
    return _ok(q, k, v, causal, scale)


@register("f_abort")
def f_abort(q, k, v, *, causal, scale):
    """Aborts its process at seq_q 128 alone: the lengths after it run in a fresh worker."""
    if q.shape[2] != 128:
        return _ok(q, k, v, causal, scale)
    os.write(2, b"planted abort in f_abort\n")
    os.abort()


@register("f_hang")
def f_hang(q, k, v, *, causal, scale):
    time.sleep(3600)


@register("f_long")
def f_long(q, k, v, *, causal, scale):
    """Fails as a compiler does: a long command line first, then the error, then warnings."""
    command = "g++ " + " ".join(f"-I/very/long/include/path/number/{i}" for i in range(60))
    warnings = "".join(
        f"/tmp/k.cpp:{200 + i}:1: warning: narrowing [-Woverflow]\n" for i in range(20)
    )
    raise RuntimeError(
        f"C++ compile error\n\nCommand:\n{command}\n\nOutput:\n"
        f"/tmp/k.cpp:85:55: error: planted_x\n{warnings}"
    )
