"""Deterministic inputs of a case, the same values for every impl and every device."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from attnbench.case import Case
from attnbench.masks import Layout, Mask
from attnbench.seeds import STREAMS, generator

DRAW_WHOLE = 2**28  # elements drawn in one piece; larger tensors per batch element
DRAW_THREADS = 16  # at most this many pieces of a large tensor drawn at once (host memory)
PAGE_TOKENS = 128  # tokens per page of a paged KV cache (one FlexAttention key block)


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
    seed: int = 0  # what they were drawn from (a paged KV cache's page order too)


def draws(case: Case, seed: int, paged: bool = False) -> dict | None:
    """What ``case`` draws beyond q, k, v, as stored in a run's draws file (JSON-ready), or
    None when it draws nothing: the seed, the offsets of the streams used (seeds.py), and
    ``key_lengths`` (padding), ``doc_lens`` (document), ``random_blocks`` (block_sparse,
    -1 where fewer were left) and, with ``paged``, ``page_order`` (the block table)."""
    out = case.kind.layout(case, seed).draws()
    if paged and case.level == "op":
        out["page_order"] = page_order(case.batch, case.seq_kv, seed).tolist()
    if not out:
        return None
    used = [s for s, k in DRAWN_BY.items() if k in out]
    return {
        "case": case.label(),
        **case.columns(),
        "seed": seed,
        "streams": {s: STREAMS[s] for s in used},
        **out,
    }


# stream (seeds.py) -> the draws-file field it fills
DRAWN_BY = {
    "padding": "key_lengths",
    "documents": "doc_lens",
    "sparse": "random_blocks",
    "pages": "page_order",
}


def from_draws(record: dict) -> tuple[Case, Layout, torch.Tensor | None]:
    """A draws-file record back to its case, its mask's layout and its block table (None
    where the case has none), without the seed."""
    case = Case.from_row(record)
    table = record.get("page_order")
    table = None if table is None else torch.tensor(table, dtype=torch.int32)
    return case, case.kind.from_draws(case, record), table


def input_bytes(case: Case) -> int:
    """The bytes ``make_inputs`` holds on the case's device: q, k, v (and dout), or at level
    layer x, the four projection weights (and dout)."""
    B, Hq, Hkv, D = case.batch, case.heads, case.kv_heads, case.head_dim
    if case.level == "layer":
        dm, dkv = case.d_model, Hkv * D
        x = B * case.seq_q * dm
        sizes = [x, dm * dm, dkv * dm, dkv * dm, dm * dm, x if case.backward else 0]
    else:
        q, kv = B * Hq * case.seq_q * D, B * Hkv * case.seq_kv * D
        sizes = [q, kv, kv, q if case.backward else 0]
    return sum(sizes) * case.torch_dtype.itemsize


def make_inputs(case: Case, seed: int) -> Inputs:
    """Standard-normal q, k, v (and dout) drawn on the CPU from ``seed`` in float32, then cast
    to the case's dtype and moved to its device, so every device sees the same numbers (a
    tensor over DRAW_WHOLE elements: ``draw_large``).
    Level layer draws x (B, S, d_model) and the projection weights instead (std 1/sqrt(d_in),
    so q, k, v come out near unit variance), the same for every impl."""
    gen = generator("qkv", seed)
    B, Hq, Hkv, D = case.batch, case.heads, case.kv_heads, case.head_dim

    def draw(*shape: int, std: float = 1.0) -> torch.Tensor:
        if math.prod(shape) <= DRAW_WHOLE:
            t = torch.randn(*shape, generator=gen, dtype=torch.float32) * std
            return t.to(device=case.device, dtype=case.torch_dtype)
        return draw_large(shape, std, int(torch.randint(2**62, (1,), generator=gen)), case)

    mask = Mask(case.mask, case.kind.layout(case, seed), case.causal_align, case.modifier())
    if case.level == "layer":
        dm, dkv = case.d_model, Hkv * D
        x = draw(B, case.seq_q, dm)
        weights = tuple(draw(d_out, dm, std=dm**-0.5) for d_out in (dm, dkv, dkv, dm))
        dout = draw(B, case.seq_q, dm) if case.backward else None
        return Inputs(
            None, None, None, dout, scale=D**-0.5, mask=mask, x=x, weights=weights, seed=seed
        )
    q = draw(B, Hq, case.seq_q, D)
    k = draw(B, Hkv, case.seq_kv, D)
    v = draw(B, Hkv, case.seq_kv, D)
    dout = draw(B, Hq, case.seq_q, D) if case.backward else None
    return Inputs(q, k, v, dout, scale=D**-0.5, mask=mask, seed=seed)


def draw_large(shape: tuple[int, ...], std: float, base: int, case: Case) -> torch.Tensor:
    """A tensor over DRAW_WHOLE elements (a long KV cache, a large batch), one batch element
    at a time from a generator of its own (seeded ``base + b``; ``base`` comes from the case's
    stream), on every host core at once: one generator draws about 40-100 M normals a
    second, so the 2.1 G keys and values of a 128k cache at batch 32 took 40 s in one piece.
    Each piece is float32 on the host only while it is drawn and cast."""
    out = torch.empty(shape, device=case.device, dtype=case.torch_dtype)

    def one(b: int) -> None:
        piece = torch.randn(*shape[1:], generator=torch.Generator().manual_seed(base + b))
        out[b] = piece.mul_(std)

    with ThreadPoolExecutor(min(shape[0], os.cpu_count() or 1, DRAW_THREADS)) as pool:
        list(pool.map(one, range(shape[0])))  # list: a piece's error is raised here
    return out


PART_STD = 0.5  # of a module's biases and norm biases, and of its norm weights about 1


def layer_parts(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """A module's learned parts beyond the four weights (run/measuring/layer.py EXTRAS), drawn from
    ``seed`` apart from x and the weights, float32 on the CPU, each at its largest size (a
    projection's out_features; a norm over each head takes the first head_dim): biases and
    norm biases normal with std PART_STD, norm weights 1 plus that, so that a dropped part
    shows. Drawn whole in a fixed order: which parts a module has moves no other."""
    gen = generator("layer_parts", seed)
    dq, dkv = case.d_model, case.kv_heads * case.head_dim
    sizes = dict(bq=dq, bk=dkv, bv=dkv, bo=dq, q_norm_w=dq, q_norm_b=dq, k_norm_w=dkv, k_norm_b=dkv)
    out = {n: torch.randn(size, generator=gen) * PART_STD for n, size in sizes.items()}
    return {n: t + 1 if n.endswith("_norm_w") else t for n, t in out.items()}


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Canonical (B, H, S, D) to an impl's layout, contiguous."""
    return (t if layout == "bhsd" else t.transpose(1, 2)).contiguous()


def from_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """An impl's layout back to canonical (B, H, S, D)."""
    return t if layout == "bhsd" else t.transpose(1, 2)


def page_order(batch: int, seq_kv: int, seed: int, page_tokens: int = PAGE_TOKENS) -> torch.Tensor:
    """The block table of a paged KV cache: (B, P) int32, P = ceil(Skv / page_tokens), a
    shuffle of the B * P pool pages drawn from ``seed`` (stream "pages")."""
    P = -(-seq_kv // page_tokens)
    order = torch.randperm(batch * P, generator=generator("pages", seed))
    return order.view(batch, P).to(torch.int32)


def paged(
    k: torch.Tensor, v: torch.Tensor, seed: int, page_tokens: int = PAGE_TOKENS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k, v (B, Hkv, Skv, D) as a paged KV cache: pools (B * P, page_tokens, Hkv, D) and a
    block table (B, P) int32, P = ceil(Skv / page_tokens); logical page p of sequence b is
    pool page block_table[b, p]. Pages are shuffled (from ``seed``), as a server's cache is
    after many requests come and go; the tail of a last partial page is zero."""
    B, Hkv, Skv, D = k.shape
    P = -(-Skv // page_tokens)
    table = page_order(B, Skv, seed, page_tokens).to(device=k.device)  # (B, P)
    pools = []
    for t in (k, v):
        pages = t.new_zeros(B, P * page_tokens, Hkv, D)
        pages[:, :Skv] = t.transpose(1, 2)  # (B, Skv, Hkv, D)
        pool = t.new_empty(B * P, page_tokens, Hkv, D)
        pool[table.flatten().long()] = pages.view(B * P, page_tokens, Hkv, D)
        pools.append(pool)
    return pools[0], pools[1], table
