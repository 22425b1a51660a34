"""Deterministic inputs of a case, the same values for every impl and every device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.case import Case
from attnbench.masks import Mask
from attnbench.patterns import PATTERN_MASKS, Pattern

PADDING_SEED_OFFSET = 7919  # key lengths come from their own stream: q, k, v stay as they were


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor | None  # (B, Hq, Sq, D); level op
    k: torch.Tensor | None  # (B, Hkv, Skv, D)
    v: torch.Tensor | None  # (B, Hkv, Skv, D)
    dout: torch.Tensor | None  # the upstream gradient when the mode has backward:
    #                            (B, Hq, Sq, D) at level op, (B, S, d_model) at level layer
    scale: float
    mask: Mask = field(default_factory=Mask)
    x: torch.Tensor | None = None  # (B, S, d_model); level layer
    weights: tuple[torch.Tensor, ...] | None = None  # level layer: layer.WEIGHTS, (out, in)


def key_lengths(case: Case, seed: int) -> list[int] | None:
    """Valid key lengths per batch for mask=padding, uniform in [1, seq_kv] (never 0: a row
    with every key masked has no softmax), drawn from ``seed`` apart from q, k, v."""
    if case.mask != "padding":
        return None
    gen = torch.Generator().manual_seed(seed + PADDING_SEED_OFFSET)
    return torch.randint(1, case.seq_kv + 1, (case.batch,), generator=gen).tolist()


def pattern(case: Case, seed: int) -> Pattern | None:
    """The drawn layout of masks document, block_sparse and strided (patterns.py), from
    ``seed`` apart from q, k, v; None for the other masks."""
    if case.mask not in PATTERN_MASKS:
        return None
    return Pattern.make(case.mask, case.pattern, case.batch, case.seq_q, seed)


def make_inputs(case: Case, seed: int) -> Inputs:
    """Standard-normal q, k, v (and dout) drawn on the CPU from ``seed`` in float32, then cast
    to the case's dtype and moved to its device, so every device sees the same numbers.
    Level layer draws x (B, S, d_model) and the projection weights instead (std 1/sqrt(d_in),
    so q, k, v come out near unit variance), the same for every impl."""
    gen = torch.Generator().manual_seed(seed)
    B, Hq, Hkv, D = case.batch, case.heads, case.kv_heads, case.head_dim

    def draw(*shape: int, std: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32) * std
        return t.to(device=case.device, dtype=case.torch_dtype)

    lens = key_lengths(case, seed)
    mask = Mask(
        case.mask, case.window, None if lens is None else torch.tensor(lens, device=case.device)
    )
    mask.pattern = pattern(case, seed)
    if case.level == "layer":
        dm, dkv = case.d_model, Hkv * D
        x = draw(B, case.seq_q, dm)
        weights = tuple(draw(d_out, dm, std=dm**-0.5) for d_out in (dm, dkv, dkv, dm))
        dout = draw(B, case.seq_q, dm) if case.backward else None
        return Inputs(None, None, None, dout, scale=D**-0.5, mask=mask, x=x, weights=weights)
    q = draw(B, Hq, case.seq_q, D)
    k = draw(B, Hkv, case.seq_kv, D)
    v = draw(B, Hkv, case.seq_kv, D)
    dout = draw(B, Hq, case.seq_q, D) if case.backward else None
    return Inputs(q, k, v, dout, scale=D**-0.5, mask=mask)


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Canonical (B, H, S, D) to an impl's layout, contiguous."""
    return (t if layout == "bhsd" else t.transpose(1, 2)).contiguous()


def from_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """An impl's layout back to canonical (B, H, S, D)."""
    return t if layout == "bhsd" else t.transpose(1, 2)
