"""Level ``layer``: a multi-head self-attention block around an impl's core attention.

    x (B, S, d_model) -> q = x Wq^T, k = x Wk^T, v = x Wv^T -> split heads -> attention
    -> merge heads (B, S, Hq·D) -> out = merged Wo^T (B, S, d_model),   d_model = Hq·D

Weights are stored (out_features, in_features) like nn.Linear: Wq and Wo (d_model, d_model),
Wk and Wv (Hkv·D, d_model), drawn from the seed (inputs.py) and shared by every impl. Heads are
split by a view (bshd impls) or a view and a transpose (bhsd impls, as in nanoGPT), with no
copy; an impl that needs contiguous tensors pays for its own copy, inside the timed region.

A model's own module (run/measuring/layer_module.py) may have more (``Parts``): a bias on any of
the four projections, a norm on q and on k (RMSNorm or LayerNorm with its learned weight, over each
head or over the whole projection) after the projection and its bias, and the other GQA head
order (attnbench/heads.py). The reference is the layer with its parts in float64 around the
float64 attention reference: the attention's gradients are that reference's own, the
projections' and norms' are autograd's in float64 around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from attnbench.case import Case
from attnbench.heads import FORMULA, HEAD_ORDERS, computed_by, same
from attnbench.measure.agreement import Truth, checked_names, legacy_agrees, legacy_error
from attnbench.measure.reference import reference
from attnbench.module_layout import QKNorm

WEIGHTS = ("wq", "wk", "wv", "wo")
# the learned parts beyond the four weights, in the order their gradients are checked
EXTRAS = ("bq", "bk", "bv", "bo", "q_norm_w", "q_norm_b", "k_norm_w", "k_norm_b")
# Not checked: a bias on every key adds q·bk to all of a query's scores alike, which softmax
# ignores (a soft-cap aside), so its gradient is zero up to rounding, a rel_err of noise
UNCHECKED = ("bk",)


@dataclass(frozen=True)
class Parts:
    """What a layer has beyond the plain block: ``extras`` (EXTRAS name -> tensor: a bias
    (out_features,), a norm's weight or bias (D,) or (H·D,)), the q and k norms (kind, scope
    and eps resolved) and the head order."""

    extras: dict = field(default_factory=dict)
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    head_order: str = "grouped"

    def grad_names(self) -> list[str]:
        return [f"d{n}" for n in EXTRAS if n in self.extras and n not in UNCHECKED]


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
    attn,
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


def normalise(t, norm: QKNorm, weight, bias, heads: int) -> torch.Tensor:
    """t (B, S, H·D) through ``norm`` (kind, scope, eps resolved) with its weight and bias."""
    t = t.unflatten(-1, (heads, -1)) if norm.scope == "head" else t  # (B, S, H, D)
    if norm.kind == "layer":
        t = t - t.mean(-1, keepdim=True)
    t = t * torch.rsqrt(t.square().mean(-1, keepdim=True) + norm.eps)
    if weight is not None:
        t = t * (1 + weight if norm.unit_offset else weight)
    if bias is not None:
        t = t + bias
    return t.flatten(-2) if norm.scope == "head" else t


def _project(t: dict, p: str, norm: QKNorm | None, heads: int) -> torch.Tensor:
    """Projection ``p`` (q, k or v) of t["x"] with its bias and norm: (B, H, S, D)."""
    y = t["x"] @ t[f"w{p}"].T  # (B, S, H·D)
    if f"b{p}" in t:
        y = y + t[f"b{p}"]
    if norm is not None:
        y = normalise(y, norm, t.get(f"{p}_norm_w"), t.get(f"{p}_norm_b"), heads)
    return split_heads(y, heads, "bhsd")


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
    parts: Parts | None = None,
    mask=None,
):
    """The layer with ``parts`` (None: the plain block) in ``dtype`` around
    reference.reference (``mask``: a masks.Mask, or None). Returns ``(out,
    grads)``; grads is ``(dx, dwq, dwk, dwv, dwo)`` and then the gradient of each of
    ``parts.extras`` in EXTRAS order but the UNCHECKED, when ``dout`` (B, S, d_model) is
    given."""
    parts = parts or Parts()
    grad = dout is not None
    extras = [n for n in EXTRAS if n in parts.extras]
    names = ("x", *WEIGHTS, *extras)
    given = (x, *weights, *(parts.extras[n] for n in extras))
    t = {n: g.detach().to(dtype).requires_grad_(grad) for n, g in zip(names, given)}
    order = computed_by(heads, kv_heads, parts.head_order)  # None: the grouped order
    with torch.set_grad_enabled(grad):
        q = _project(t, "q", parts.q_norm, heads)  # (B, Hq, S, D)
        k = _project(t, "k", parts.k_norm, kv_heads)  # (B, Hkv, S, D)
        v = _project(t, "v", None, kv_heads)
        if order is not None:  # the reference's grouped order: its head h is q's order[h]
            q = q.index_select(1, order.to(q.device))
    wo, bo = t["wo"].detach(), t.get("bo")
    da = None if dout is None else split_heads(dout.to(dtype) @ wo, heads, "bhsd")
    if da is not None and order is not None:
        da = da.index_select(1, order.to(da.device))
    attn, grads = reference(
        q.detach(),
        k.detach(),
        v.detach(),
        causal=causal,
        scale=scale,
        dout=da,
        dtype=dtype,
        mask=mask,
    )
    if order is not None:  # back to the layer's own head order
        attn = attn.index_select(1, order.argsort().to(attn.device))
    merged = merge_heads(attn, "bhsd")  # (B, S, d_model)
    out = merged @ wo.T + (0 if bo is None else bo.detach())
    if not grad:
        return out, None
    before = [n for n in names if n not in ("wo", "bo")]
    found = torch.autograd.grad((q, k, v), [t[n] for n in before], [g.to(dtype) for g in grads])
    d = dict(zip(before, found))
    d["wo"] = dout.to(dtype).flatten(0, 1).T @ merged.flatten(0, 1)
    if bo is not None:
        d["bo"] = dout.to(dtype).sum((0, 1))
    return out, tuple(d[n] for n in names if n not in UNCHECKED)


def layer_truth(case: Case, inputs, parts: Parts | None = None, **args) -> Truth:
    """The legacy rule's truth (docs/method.md) of a layer case with ``parts``: the float64
    reference, the baseline (the same layer in the case's dtype), the checked tensors' names
    and, with GQA, a diagnosis that tries the other head order on a disagreeing output."""
    parts = parts or Parts()

    def run(dtype, p=parts, **changed):
        return layer_reference(
            inputs.x, inputs.weights, heads=case.heads, kv_heads=case.kv_heads, dtype=dtype,
            parts=p, **{**args, **changed},
        )  # fmt: skip

    out, grads = run(torch.float64)
    ref = [out, *(grads or ())]
    b_out, b_grads = run(case.torch_dtype)
    baseline = [legacy_error(b, r) for b, r in zip([b_out, *(b_grads or ())], ref)]
    names = checked_names(case) + (parts.grad_names() if case.backward else [])

    def explain(got: torch.Tensor) -> list[str]:
        """A note when ``got`` (out) is the layer in the other head order."""
        declared = parts.head_order
        other = next(o for o in HEAD_ORDERS if o != declared)
        alt, _ = run(torch.float64, replace(parts, head_order=other), dout=None)  # out only
        if not legacy_agrees(legacy_error(got, alt), baseline[0], case.torch_dtype):
            return []
        return [
            f"out matches kv head {FORMULA[other]} for query head h (head_order={other!r}); "
            f"declared head_order={declared!r}, {FORMULA[declared]}"
        ]

    mapped = not same(case.heads, case.kv_heads, "interleaved")  # the orders differ
    return Truth(ref, baseline=baseline, names=names, explain=explain if mapped else None)
