"""Host side of ``triton_flash``: checks, layouts, autograd, the dense and packed entries.

Dense layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D).
Packed (varlen) layout: q (total_q, Hq, D); k, v (total_k, Hkv, D); sequence b owns rows
``cu_seqlens[b] : cu_seqlens[b + 1]`` and never attends to another sequence's rows.
GQA/MQA: Hq % Hkv == 0, q head h reads kv head h // (Hq // Hkv); k/v are never expanded.

Head dims: every multiple of 8 from 16 to 256. The kernels build their tiles for the next
power of two (``head_pad``) and the tensor descriptors zero-fill the extra columns;
``padded_flop_fraction`` is the share of the tile matmul work spent on those zeros.

Causal with a diagonal offset: query i sees key j iff j <= i + causal_offset. 0 is SDPA's
``is_causal`` (top-left); Skv - Sq aligns the last query with the last key (bottom-right,
as decoding with several new tokens needs). Query rows that see no key (i + offset < 0,
e.g. bottom-right with Sq > Skv) get output 0, log-sum-exp -inf and zero gradients.

Importing this module imports triton; ``__init__.py`` imports it lazily.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from attnbench.impls.triton_flash import tuning
from attnbench.impls.triton_flash.bwd import bwd_kernel, delta_kernel  # noqa: F401
from attnbench.impls.triton_flash.fwd import fwd_kernel  # noqa: F401

HEAD_DIMS = tuple(range(16, 257, 8))
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
ALIGNS = ("top_left", "bottom_right")  # masks.ALIGNS


def head_pad(head_dim: int) -> int:
    """The tile width the kernels use for ``head_dim``: the next power of two (>= 16)."""
    return max(16, triton.next_power_of_2(head_dim))


def padded_flop_fraction(head_dim: int) -> float:
    """Share of the tile matmul FLOPs spent on zero padding: both QK^T (contraction over the
    head dim) and PV (output width = head dim) are computed at ``head_pad(head_dim)``, so it
    is 1 - D / pad (80 -> 0.375, 96 -> 0.25, 192 -> 0.25). Memory traffic is not padded:
    the descriptors read and write only the real columns."""
    return 1.0 - head_dim / head_pad(head_dim)


def causal_offset_for(align: str, seq_q: int, seq_kv: int) -> int:
    """The diagonal offset of a causal alignment name: top-left 0, bottom-right Skv - Sq."""
    if align not in ALIGNS:
        raise ValueError(f"causal_align={align!r} (supported: {', '.join(ALIGNS)})")
    return 0 if align == "top_left" else seq_kv - seq_q


def interpreting() -> bool:
    return tuning.interpreting()


def _check(q, k, v, dims: int) -> None:
    names = "q (B, Hq, Sq, D), k/v (B, Hkv, Skv, D)"
    if dims == 3:
        names = "q (T, Hq, D), k/v (T, Hkv, D)"
    if q.dim() != dims or k.dim() != dims or v.dim() != dims:
        raise ValueError(f"q, k, v must be {dims}-d: {names}")
    if k.shape != v.shape or k.shape[-1] != q.shape[-1] or (dims == 4 and k.shape[0] != q.shape[0]):
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    hq, hkv = q.shape[-3 if dims == 4 else -2], k.shape[-3 if dims == 4 else -2]
    if hq % hkv:
        raise ValueError(f"heads={hq} must be a multiple of kv_heads={hkv}")
    d = q.shape[-1]
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim={d} not supported (supported: multiples of 8, 16..256)")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: need one of {DTYPES}")


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """A tensor a descriptor can read: last dim contiguous, other strides and the start
    16-byte aligned; a copy only when it is not. The copy is a new allocation (the caching
    allocator aligns it), never ``contiguous()``, which returns a contiguous tensor as it is,
    misaligned start included (a view that starts a few elements into its storage)."""
    elt = t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0
    ok = ok and all((s * elt) % 16 == 0 for s in t.stride()[:-1])
    return t if ok else t.clone(memory_format=torch.contiguous_format)


@functools.cache
def _unused_lengths(device: torch.device) -> torch.Tensor:
    """The cumulative-lengths argument of a dense call, never read: made once per device, so
    that a call launches its kernel alone (a fill kernel before every call showed in the
    profiler on an H100)."""
    return torch.zeros(2, device=device, dtype=torch.int32)


class _Seqs:
    """How rows are grouped: dense (B, H, S, D) or packed (T, H, D) with cumulative lengths.
    ``strides(t)`` gives each layout as (sequence, head, row) strides for the kernels."""

    def __init__(self, q, k, cu_q=None, cu_k=None, max_q=0, max_k=0):
        self.varlen = cu_q is not None
        if self.varlen:
            self.n, self.sq, self.skv = cu_q.numel() - 1, int(max_q), int(max_k)
            self.hq, self.hkv, self.rows = q.shape[1], k.shape[1], q.shape[0]
            self.cu_q, self.cu_k = cu_q, cu_k
        else:
            self.n, self.hq, self.sq = q.shape[0], q.shape[1], q.shape[2]
            self.hkv, self.skv, self.rows = k.shape[1], k.shape[2], q.shape[2]
            self.cu_q = self.cu_k = _unused_lengths(q.device)

    def strides(self, t) -> tuple[int, int, int]:
        if self.varlen:
            return 0, t.stride(1), t.stride(0)
        return t.stride(0), t.stride(1), t.stride(2)

    def lse_shape(self) -> tuple:
        return (self.hq, self.rows) if self.varlen else (self.n, self.hq, self.sq)

    def lse_strides(self) -> tuple[int, int]:
        return (0, self.rows) if self.varlen else (self.hq * self.sq, self.sq)

    def keys(self) -> tuple[int, int]:
        return max(16, triton.next_power_of_2(self.sq)), max(16, triton.next_power_of_2(self.skv))


def _consts(q, seqs: _Seqs, causal: bool, align_end: bool) -> dict:
    d = q.shape[-1]
    return dict(
        HEAD_DIM=d,
        HEAD_PAD=head_pad(d),
        CAUSAL=bool(causal),
        ALIGN_END=bool(causal and align_end),
        VARLEN=seqs.varlen,
        IEEE=q.dtype == torch.float32,
    )


def forward_args(q, k, v, o, lse, seqs: _Seqs, *, scale: float, offset: int) -> tuple:
    """The forward kernel's runtime arguments (``fwd_kernel``'s, constexprs left out)."""
    return (
        q, k, v, o, lse, seqs.cu_q, seqs.cu_k,
        *seqs.strides(q), *seqs.strides(k), *seqs.strides(v), *seqs.strides(o),
        *seqs.lse_strides(), seqs.n, seqs.hq, seqs.hq // seqs.hkv, seqs.sq, seqs.skv,
        scale * LOG2E, int(offset), *seqs.keys(),
    )  # fmt: skip


def _forward(q, k, v, seqs: _Seqs, *, causal, scale, offset, align_end, tiles, config=None):
    o = torch.empty_like(q, memory_format=torch.contiguous_format)  # like q
    lse = torch.empty(seqs.lse_shape(), device=q.device, dtype=torch.float32)
    args = forward_args(q, k, v, o, lse, seqs, scale=scale, offset=offset if causal else 0)

    def grid(meta):
        tiles_m = triton.cdiv(seqs.sq, meta["BLOCK_M"]) * seqs.n * seqs.hq
        return (tuning.programs(tiles_m, meta),)

    tuning.launch("fwd", grid, args, _consts(q, seqs, causal, align_end), tiles, config)
    return o, lse


def _backward(do, q, k, v, o, lse, seqs: _Seqs, *, causal, scale, offset, align_end, tiles,
              config=None):  # fmt: skip
    do = _tma_ready(do)
    d = q.shape[-1]
    delta = torch.empty_like(lse)
    # delta over every row: packed rows are one "sequence" of seqs.rows rows
    n_rows = 1 if seqs.varlen else seqs.n
    bm = 16 if interpreting() else 64
    delta_kernel[(triton.cdiv(seqs.rows, bm), n_rows * seqs.hq)](
        o, do, delta, *seqs.strides(o), *seqs.strides(do), *seqs.lse_strides(), seqs.hq,
        seqs.rows, HEAD_DIM=d, HEAD_PAD=head_pad(d), BLOCK_M=bm,
    )  # fmt: skip
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # atomics add into it
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    args = (
        q, k, v, do, lse, delta, dq, dk, dv, seqs.cu_q, seqs.cu_k,
        *seqs.strides(q), *seqs.strides(k), *seqs.strides(v), *seqs.strides(do),
        *seqs.strides(dq), *seqs.strides(dk), *seqs.lse_strides(),
        seqs.hq, seqs.hkv, seqs.hq // seqs.hkv, seqs.sq, seqs.skv, scale * LOG2E, scale,
        int(offset) if causal else 0, *seqs.keys(),
    )  # fmt: skip
    tuning.launch(
        "bwd",
        lambda meta: (seqs.n * seqs.hkv, triton.cdiv(seqs.skv, meta["BLOCK_N"])),
        args,
        _consts(q, seqs, causal, align_end),
        tiles,
        config,
    )
    return dq.to(q.dtype), dk, dv


def forward(q, k, v, *, causal: bool, scale: float, causal_offset: int = 0, tiles=None,
            config=None):  # fmt: skip
    """Dense forward: (out (B, Hq, Sq, D), lse (B, Hq, Sq) float32, natural log).
    ``config``: one whole forward config tuple (``tuning.meta_of``), run as given."""
    _check(q, k, v, 4)
    q, k, v = (_tma_ready(t) for t in (q, k, v))
    seqs = _Seqs(q, k)
    return _forward(
        q, k, v, seqs, causal=causal, scale=scale, offset=causal_offset, align_end=False,
        tiles=tiles, config=config,
    )  # fmt: skip


def backward(do, q, k, v, o, lse, *, causal: bool, scale: float, causal_offset: int = 0,
             tiles=None, config=None):  # fmt: skip
    """Dense backward: (dq, dk, dv); dk/dv summed over each GQA group. ``config``: one
    whole backward config tuple, run as given."""
    q, k, v = (_tma_ready(t) for t in (q, k, v))
    return _backward(
        do, q, k, v, o, lse, _Seqs(q, k), causal=causal, scale=scale, offset=causal_offset,
        align_end=False, tiles=tiles, config=config,
    )  # fmt: skip


class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, offset, tiles, configs):
        args = dict(causal=causal, scale=scale, causal_offset=offset, tiles=tiles)
        o, lse = forward(q, k, v, **args, config=configs.get("fwd"))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = dict(args, config=configs.get("bwd"))
        return o

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv = backward(do, *ctx.saved_tensors, **ctx.args)
        return dq, dk, dv, None, None, None, None, None


class _Packed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, align_end, tiles,
                configs):  # fmt: skip
        seqs = _Seqs(q, k, cu_q, cu_k, max_q, max_k)
        args = dict(causal=causal, scale=scale, offset=0, align_end=align_end, tiles=tiles)
        o, lse = _forward(q, k, v, seqs, **args, config=configs.get("fwd"))
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.args = dict(args, config=configs.get("bwd"))
        ctx.max = (max_q, max_k)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        seqs = _Seqs(q, k, cu_q, cu_k, *ctx.max)
        dq, dk, dv = _backward(do, q, k, v, o, lse, seqs, **ctx.args)
        return dq, dk, dv, *([None] * 9)


def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None,
                    causal_offset: int = 0, tiles=None, configs=None):  # fmt: skip
    """q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> out (B, Hq, Sq, D), differentiable.

    ``causal_offset``: query i sees key j iff j <= i + causal_offset (when ``causal``);
    ``causal_offset_for("bottom_right", Sq, Skv)`` gives the bottom-right alignment.
    ``tiles=(BLOCK_M, BLOCK_N[, PIPELINE])`` skips autotuning; ``configs={"fwd": ...,
    "bwd": ...}`` runs whole config tuples (variant flags included, ``tuning.meta_of``)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return _Dense.apply(
        q, k, v, bool(causal), float(scale), int(causal_offset), tiles, dict(configs or {})
    )


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                           max_seqlen_k: int, *, causal: bool = False,
                           scale: float | None = None, causal_align: str = "top_left",
                           tiles=None, configs=None):  # fmt: skip
    """Packed sequences: q (total_q, Hq, D); k, v (total_k, Hkv, D); ``cu_seqlens_*``
    (n + 1,) int cumulative lengths starting at 0 -> out (total_q, Hq, D), differentiable.
    Sequence b's queries attend only to sequence b's keys; ``causal_align`` picks the
    diagonal per sequence (top-left: offset 0; bottom-right: its Skv_b - Sq_b)."""
    _check(q, k, v, 3)
    causal_offset_for(causal_align, 0, 0)  # validates the name
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length (n + 1)")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v = (_tma_ready(t) for t in (q, k, v))
    cu_q, cu_k = (c.to(device=q.device, dtype=torch.int32) for c in (cu_seqlens_q, cu_seqlens_k))
    return _Packed.apply(
        q, k, v, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal), float(scale),
        causal_align == "bottom_right", tiles, dict(configs or {}),
    )  # fmt: skip
