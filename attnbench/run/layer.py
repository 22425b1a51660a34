"""Level ``layer``: a multi-head self-attention block around an impl's core attention.

    x (B, S, d_model) -> q = x Wq^T, k = x Wk^T, v = x Wv^T -> split heads -> attention
    -> merge heads (B, S, Hq·D) -> out = merged Wo^T (B, S, d_model),   d_model = Hq·D

Weights are stored (out_features, in_features) like nn.Linear: Wq and Wo (d_model, d_model),
Wk and Wv (Hkv·D, d_model), drawn from the seed (inputs.py) and shared by every impl. Heads are
split by a view (bshd impls) or a view and a transpose (bhsd impls, as in nanoGPT), with no
copy; an impl that needs contiguous tensors pays for its own copy, inside the timed region.
The reference is the same layer in float64 around the float64 attention reference, with its
gradients (x and the four weights) by the chain rule.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnbench.measure.reference import reference

WEIGHTS = ("wq", "wk", "wv", "wo")


def split_heads(t: torch.Tensor, heads: int, layout: str) -> torch.Tensor:
    """(B, S, H·D) -> (B, S, H, D) for bshd, (B, H, S, D) for bhsd, a view."""
    t = t.unflatten(-1, (heads, -1))  # (B, S, H, D)
    return t if layout == "bshd" else t.transpose(1, 2)


def merge_heads(t: torch.Tensor, layout: str) -> torch.Tensor:
    """(B, S, H, D) or (B, H, S, D) -> (B, S, H·D)."""
    t = t if layout == "bshd" else t.transpose(1, 2)  # (B, S, H, D)
    return t.flatten(-2)


def layer_forward(
    x: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    attn: Callable,
    heads: int,
    kv_heads: int,
    layout: str,
    out_layout: str | None = None,
) -> torch.Tensor:
    """x (B, S, d_model) -> (B, S, d_model); ``attn(q, k, v)`` in ``layout``, its output in
    ``out_layout`` (None: ``layout``)."""
    wq, wk, wv, wo = weights
    q = split_heads(F.linear(x, wq), heads, layout)  # (B, Hq, S, D) or (B, S, Hq, D)
    k = split_heads(F.linear(x, wk), kv_heads, layout)
    v = split_heads(F.linear(x, wv), kv_heads, layout)
    return F.linear(merge_heads(attn(q, k, v), out_layout or layout), wo)


def layer_reference(
    x,
    weights,
    *,
    heads: int,
    kv_heads: int,
    causal: bool,
    scale: float,
    dout=None,
    dtype=torch.float64,
    window=None,
    kv_lens=None,
    pattern=None,
    score_mod=None,
):
    """The layer in ``dtype`` around reference.reference. Returns ``(out, grads)``; grads is
    ``(dx, dwq, dwk, dwv, dwo)`` when ``dout`` (B, S, d_model) is given."""
    x, wq, wk, wv, wo = (t.detach().to(dtype) for t in (x, *weights))
    q, k, v = (
        split_heads(x @ w.T, h, "bhsd") for w, h in ((wq, heads), (wk, kv_heads), (wv, kv_heads))
    )  # (B, H, S, D)
    da = None if dout is None else split_heads(dout.to(dtype) @ wo, heads, "bhsd")
    attn, grads = reference(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        dout=da,
        dtype=dtype,
        window=window,
        kv_lens=kv_lens,
        pattern=pattern,
        score_mod=score_mod,
    )
    merged = merge_heads(attn, "bhsd")  # (B, S, d_model)
    out = merged @ wo.T
    if dout is None:
        return out, None
    dq, dk, dv = (merge_heads(g.to(dtype), "bhsd") for g in grads)  # (B, S, H·D)
    dx = dq @ wq + dk @ wk + dv @ wv
    flat_x = x.flatten(0, 1)  # (B·S, d_model)
    dws = [g.flatten(0, 1).T @ flat_x for g in (dq, dk, dv)]
    dwo = dout.to(dtype).flatten(0, 1).T @ merged.flatten(0, 1)
    return out, (dx, *dws, dwo)
