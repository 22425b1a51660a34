"""GQA head orders: which kv head query head h reads when Hkv < Hq (g = Hq / Hkv).

    grouped      h // g    the convention (attnbench's reference, SDPA, FlashAttention):
                           g consecutive query heads share a kv head
    interleaved  h % Hkv   x-transformers: query heads h, h + Hkv, h + 2 Hkv, ... share one

An impl or module declares its order (``register(..., head_order=...)``); the harness maps it
outside the timing (run/measuring/call.py at level op, the layer's reference at level layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


HEAD_ORDERS = ("grouped", "interleaved")
FORMULA = {"grouped": "h // (Hq/Hkv)", "interleaved": "h % Hkv"}


def kv_head(heads: int, kv_heads: int, order: str) -> torch.Tensor:
    """(Hq,) int64: the kv head each query head reads in ``order``."""
    import torch

    h = torch.arange(heads)
    return h // (heads // kv_heads) if order == "grouped" else h % kv_heads


def same(heads: int, kv_heads: int, order: str) -> bool:
    """Whether ``order`` reads the kv heads the convention does: grouped, no GQA, or MQA."""
    return order == "grouped" or kv_heads in (1, heads)


def computed_by(heads: int, kv_heads: int, order: str) -> torch.Tensor | None:
    """(Hq,) int64: for each query head h of the grouped convention, the head of an impl in
    ``order`` that computes it, when that impl is handed q[:, computed_by.argsort()]; None
    where the orders are the ``same``."""
    import torch

    if same(heads, kv_heads, order):
        return None
    return torch.argsort(kv_head(heads, kv_heads, order), stable=True)
