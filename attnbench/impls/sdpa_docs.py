"""Packed documents (mask document) without a document mask: the documents unpacked.

``sdpa_nested``: q, k, v viewed as jagged nested tensors, one entry per document (no copy:
the packed (B * S, H, D) values with the documents' offsets), through SDPA, which attends
within each entry. PyTorch refuses some cases (on the CPU: causal); the row is then
``unsupported`` with the reasons PyTorch logs. No GQA: SDPA's nested path takes no
``enable_gqa`` (its fused kernels want equal head counts, its math fallback cannot broadcast
nested batches), so kv_heads < heads is declared unsupported.

``sdpa_padded``: every document copied into its own row of a padded batch
(ndocs, H, Lmax, D), Lmax the longest document, keys past a document's end masked, then
scattered back; the gather and scatter are part of the timed call.

Both run mask document only; the drawn documents are in ``mask.pattern`` (patterns.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnbench.errors import one_line
from attnbench.registry import Unsupported, register

NESTED_LOGGER = "torch.nested._internal.sdpa"  # where PyTorch says why no backend took it


def nested_pairs(case, mask) -> int:
    """One score matrix per document, L x L, masked entries included."""
    return sum(n * n for row in mask.pattern.doc_lens for n in row)


def padded_pairs(case, mask) -> int:
    """One Lmax x Lmax score matrix per document, padding included."""
    lens = [n for row in mask.pattern.doc_lens for n in row]
    return len(lens) * max(lens) ** 2


class _Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(one_line(record.getMessage()))


def _nested_reasons(run) -> str:
    """PyTorch's reasons for refusing ``run``: it logs them (not warnings) before raising."""
    handler, logger = _Reasons(), logging.getLogger(NESTED_LOGGER)
    logger.addHandler(handler)
    try:
        run()
    except RuntimeError as exc:
        handler.lines.append(one_line(exc))
    finally:
        logger.removeHandler(handler)
    said = [line for line in handler.lines if not line.endswith("because:")]
    return " ".join(dict.fromkeys(said)) or "no reason given"


@register(
    "sdpa_nested",
    color="#17becf",
    layout="bshd",
    masks=("document",),
    gqa=False,
    unmasked=False,  # it unpacks packed documents: without them there is nothing to unpack
    work=nested_pairs,
    description="SDPA over jagged nested tensors, one entry per packed document",
)
def sdpa_nested(q, k, v, *, causal, scale, mask):
    # q (B, S, Hq, D); k, v (B, S, Hkv, D) -> (B, S, Hq, D)
    B, S, Hq, D = q.shape
    offsets = mask.cached(
        ("offsets", str(q.device)), lambda: mask.pattern.cu_seqlens(q.device).long()
    )  # (ndocs + 1,)

    def nest(t):  # (B, S, H, D) -> (ndocs, H, j, D), j jagged
        flat = t.reshape(B * S, t.shape[2], D)
        return torch.nested.nested_tensor_from_jagged(flat, offsets=offsets).transpose(1, 2)

    def run():
        return F.scaled_dot_product_attention(
            nest(q), nest(k), nest(v), is_causal=causal, scale=scale
        )

    try:
        out = run()  # (ndocs, Hq, j, D)
    except RuntimeError as exc:
        if "No viable backend" not in str(exc):
            raise
        why = _nested_reasons(run)
        raise Unsupported(f"PyTorch's SDPA took no nested case: {why}") from exc
    return out.transpose(1, 2).values().view(B, S, Hq, D)


@dataclass
class _Padded:
    """Where each document's positions sit in the padded batch."""

    index: torch.Tensor  # (ndocs, Lmax) flat position in B * S (0 in the padding)
    valid: torch.Tensor  # (ndocs, Lmax) bool: a real position, not padding
    keep: torch.Tensor  # (ndocs, 1, Lmax, Lmax) bool: True = attend (valid keys, causal)


def _padded(pattern, causal: bool, device) -> _Padded:
    lens = torch.tensor([n for row in pattern.doc_lens for n in row])
    starts = lens.cumsum(0) - lens  # (ndocs,) offsets in B * S
    j = torch.arange(int(lens.max()))  # (Lmax,)
    valid = j[None, :] < lens[:, None]
    index = torch.where(valid, starts[:, None] + j[None, :], 0)
    keep = valid[:, None, None, :]  # a padded query row still sees its document's keys
    if causal:
        keep = keep & (j[None, :] <= j[:, None])[None, None]
    return _Padded(index.to(device), valid.to(device), keep.to(device))


@register(
    "sdpa_padded",
    color="#bcbd22",
    masks=("document",),
    unmasked=False,  # it unpacks packed documents: without them there is nothing to unpack
    work=padded_pairs,
    description="SDPA over the documents padded to the longest one, one batch row each",
)
def sdpa_padded(q, k, v, *, causal, scale, mask):
    # q (B, Hq, S, D); k, v (B, Hkv, S, D) -> (B, Hq, S, D)
    B, Hq, S, D = q.shape
    plan = mask.cached(
        ("padded", causal, str(q.device)), lambda: _padded(mask.pattern, causal, q.device)
    )

    def pad(t):  # (B, H, S, D) -> (ndocs, H, Lmax, D)
        flat = t.transpose(1, 2).reshape(B * S, t.shape[1], D)
        return flat[plan.index].transpose(1, 2)

    out = F.scaled_dot_product_attention(
        pad(q), pad(k), pad(v), attn_mask=plan.keep, scale=scale, enable_gqa=Hq != k.shape[1]
    )  # (ndocs, Hq, Lmax, D)
    packed = out.transpose(1, 2)[plan.valid]  # (B * S, Hq, D), documents in order
    return packed.view(B, S, Hq, D).transpose(1, 2)
