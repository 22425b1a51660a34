"""A correct impl that takes a while per call (ATTNBENCH_SLOW_S seconds, default 0.02), so a
sweep can be killed part way through; with ATTNBENCH_SLOW_MIN_SEQ only calls whose query length
is at least that are slow (the others do not wait), so a sweep stops at a known row. With
ATTNBENCH_SLOW_INSIDE (a folder), a file named by its process id is there while a call is in
progress, so that a test can kill the process, or its node, inside a row."""

import os
import time
from pathlib import Path

import torch

from attnbench.registry import register


@register("slow")
def slow(q, k, v, *, causal, scale):
    inside = os.environ.get("ATTNBENCH_SLOW_INSIDE")
    mark = Path(inside) / str(os.getpid()) if inside else None
    if mark is not None:
        mark.touch()
    if q.shape[2] >= int(os.environ.get("ATTNBENCH_SLOW_MIN_SEQ", "0")):
        time.sleep(float(os.environ.get("ATTNBENCH_SLOW_S", "0.02")))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    if mark is not None:
        mark.unlink(missing_ok=True)
    return out
