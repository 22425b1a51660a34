"""Deterministic inputs of a case, the same values for every impl and every device."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.case import Case


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor  # (B, Hq, Sq, D)
    k: torch.Tensor  # (B, Hkv, Skv, D)
    v: torch.Tensor  # (B, Hkv, Skv, D)
    dout: torch.Tensor | None  # (B, Hq, Sq, D), the upstream gradient when the mode has backward
    scale: float


def make_inputs(case: Case, seed: int) -> Inputs:
    """Standard-normal q, k, v (and dout) drawn on the CPU from ``seed`` in float32, then cast
    to the case's dtype and moved to its device, so every device sees the same numbers."""
    gen = torch.Generator().manual_seed(seed)
    B, Hq, Hkv, D = case.batch, case.heads, case.kv_heads, case.head_dim

    def draw(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32)
        return t.to(device=case.device, dtype=case.torch_dtype)

    q = draw(B, Hq, case.seq_q, D)
    k = draw(B, Hkv, case.seq_kv, D)
    v = draw(B, Hkv, case.seq_kv, D)
    dout = draw(B, Hq, case.seq_q, D) if case.backward else None
    return Inputs(q, k, v, dout, scale=D ** -0.5)


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Canonical (B, H, S, D) to an impl's layout, contiguous."""
    return (t if layout == "bhsd" else t.transpose(1, 2)).contiguous()


def from_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """An impl's layout back to canonical (B, H, S, D)."""
    return t if layout == "bhsd" else t.transpose(1, 2)
