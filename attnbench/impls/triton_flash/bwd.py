"""Backward kernels of ``triton_flash``: a delta preprocess and one kernel per key/value tile.

``delta_kernel``: delta = rowsum(dO * O) in fp32, laid out like the LSE.

``bwd_kernel``: one program per (sequence, kv head, key tile). K and V of the tile are read
once (tensor descriptors, zero-filled past the sequence end and the head dim) and dK, dV are
accumulated in fp32 registers over every query tile of every q head of the GQA group, so the
group sum needs no atomics. Per query tile it computes, all transposed so that the key tile
is the M side of the matmuls (M = BLOCK_N >= 64 on a GPU, which maps to wgmma on sm90):
  S^T = K Q^T,  P^T = exp2(S^T * scale * log2 e - LSE * log2 e),  dV += P^T dO,
  dP^T = V dO^T,  dS^T = P^T (dP^T - delta),  dK += dS^T Q,
and dQ += dS K (M = BLOCK_M >= 64) is added in fp32 with atomics to a buffer the host
converts to the input dtype: 5 matmuls per (query tile, key tile), nothing recomputed twice.
``DQ_TMA`` (a variant, off by default) adds each dQ tile with one TMA reduce-add through a
tensor descriptor (``cp.reduce.async.bulk.tensor`` on sm90) instead of element-wise atomics.

Causal (query i sees key j iff j <= i + offset): query tiles that see none of the key tile
are skipped by the loop bounds; tiles that see only part of it are masked; the rest run
unmasked. Padded query rows (past the sequence end) read LSE = +inf, so their P is 0; padded
key rows are zero-filled and their dK/dV rows are dropped at the store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnbench.impls.triton_flash.fwd import _dot, seq_bounds


@triton.jit
def delta_kernel(
    O,
    DO,
    DELTA,
    s_ob,
    s_oh,
    s_os,
    s_db,
    s_dh,
    s_ds,
    s_lb,
    s_lh,
    Hq,
    S,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Rows of a (n, Hq, S, D) strided view; packed sequences are n = 1, S = total rows."""
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_PAD)
    ok = (offs_m < S)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(
        O + b * s_ob + h * s_oh + offs_m[:, None] * s_os + offs_d[None, :], mask=ok, other=0.0
    ).to(tl.float32)  # (BM, DP)
    do = tl.load(
        DO + b * s_db + h * s_dh + offs_m[:, None] * s_ds + offs_d[None, :], mask=ok, other=0.0
    ).to(tl.float32)
    tl.store(DELTA + b * s_lb + h * s_lh + offs_m, tl.sum(o * do, 1), mask=offs_m < S)


@triton.jit
def _query_tiles(
    dk,
    dv,
    k,
    v,
    q_desc,
    do_desc,
    lse_base,
    delta_base,
    dq_out,
    s_gs,
    offs_n,
    lo,
    hi,
    sq,
    offset,
    qk_scale,
    sm_scale,
    MASKED: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    DQ_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """``dq_out``: the head's dQ rows, a tensor descriptor when ``DQ_TMA``, else a pointer."""
    offs_d = tl.arange(0, HEAD_PAD)
    for m in range(lo, hi, BLOCK_M):
        offs_m = m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < sq
        q = q_desc.load([m, 0])  # (BM, DP)
        do = do_desc.load([m, 0])  # (BM, DP)
        # padded rows: LSE = +inf makes their P exactly 0
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)  # (BM,)
        zero = tl.zeros([k.shape[0], BLOCK_M], tl.float32)
        pt = tl.exp2(_dot(k, tl.trans(q), zero, IEEE) * qk_scale - lse2[None, :])  # (BN, BM)
        if MASKED:  # query i sees key j iff j <= i + offset
            pt = tl.where(offs_n[:, None] <= offs_m[None, :] + offset, pt, 0.0)
        dv = _dot(pt.to(do.dtype), do, dv, IEEE)  # (BN, DP)
        dpt = _dot(v, tl.trans(do), zero, IEEE)  # (BN, BM)
        dst = pt * (dpt - delta[None, :])  # (BN, BM)
        dk = _dot(dst.to(q.dtype), q, dk, IEEE)  # (BN, DP)
        dq = _dot(
            tl.trans(dst).to(k.dtype), k, tl.zeros([BLOCK_M, HEAD_PAD], tl.float32), IEEE
        )  # (BM, DP)
        if DQ_TMA:  # one bulk reduce-add of the tile; rows >= sq, cols >= D: dropped
            dq_out.atomic_add([m, 0], dq * sm_scale)
        else:  # element-wise fp32 atomics
            ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
            tl.atomic_add(
                dq_out + offs_m[:, None] * s_gs + offs_d[None, :],
                dq * sm_scale,
                mask=ok,
                sem="relaxed",
            )
    return dk, dv


@triton.jit
def bwd_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    DK,
    DV,
    CU_Q,
    CU_K,
    s_qb,
    s_qh,
    s_qs,
    s_kb,
    s_kh,
    s_ks,
    s_vb,
    s_vh,
    s_vs,
    s_db,
    s_dh,
    s_ds,
    s_gb,
    s_gh,
    s_gs,
    s_tb,
    s_th,
    s_ts,
    s_lb,
    s_lh,
    Hq,
    Hkv,
    GROUP,
    Sq,
    Skv,
    qk_scale,
    sm_scale,
    causal_offset,
    SQ_KEY,
    SKV_KEY,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    ALIGN_END: tl.constexpr,
    VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    DQ_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Grid (n_seq * Hkv, key tiles): program 0..n_seq*Hkv-1 take key tile 0 first, which
    for causal is the heaviest (every query sees it). DQ: fp32 (strides s_g*), zeroed;
    DK, DV: the outputs (strides s_t*)."""
    bhk = tl.program_id(0)
    b = bhk // Hkv
    hk = (bhk % Hkv).to(tl.int64)
    q0, sq = seq_bounds(CU_Q, b, Sq, VARLEN)
    k0, skv = seq_bounds(CU_K, b, Skv, VARLEN)
    b = b.to(tl.int64)
    q0 = q0.to(tl.int64)
    k0 = k0.to(tl.int64)
    start_n = tl.program_id(1) * BLOCK_N
    if start_n < skv:
        offset = causal_offset
        if ALIGN_END:
            offset += skv - sq
        k_desc = tl.make_tensor_descriptor(
            K + b * s_kb + k0 * s_ks + hk * s_kh, [skv, HEAD_DIM], [s_ks, 1], [BLOCK_N, HEAD_PAD]
        )
        v_desc = tl.make_tensor_descriptor(
            V + b * s_vb + k0 * s_vs + hk * s_vh, [skv, HEAD_DIM], [s_vs, 1], [BLOCK_N, HEAD_PAD]
        )
        k = k_desc.load([start_n, 0])  # (BN, DP)
        v = v_desc.load([start_n, 0])  # (BN, DP)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        dk = tl.zeros([BLOCK_N, HEAD_PAD], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_PAD], tl.float32)
        if CAUSAL:
            # rows i < start_n - offset see none of these keys; rows i >= start_n + BN - 1 -
            # offset see all of them
            lo = (tl.maximum(start_n - offset, 0) // BLOCK_M) * BLOCK_M
            full = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M
            lo = tl.minimum(lo, sq)
            mid = tl.minimum(tl.maximum(full, lo), sq)
        else:
            lo = sq * 0
            mid = sq * 0
        for g in range(GROUP):  # the q heads sharing this kv head
            h = hk * GROUP + g
            q_desc = tl.make_tensor_descriptor(
                Q + b * s_qb + q0 * s_qs + h * s_qh, [sq, HEAD_DIM], [s_qs, 1], [BLOCK_M, HEAD_PAD]
            )
            do_desc = tl.make_tensor_descriptor(
                DO + b * s_db + q0 * s_ds + h * s_dh, [sq, HEAD_DIM], [s_ds, 1], [BLOCK_M, HEAD_PAD]
            )
            lse_base = LSE + b * s_lb + h * s_lh + q0
            delta_base = DELTA + b * s_lb + h * s_lh + q0
            dq_out = DQ + b * s_gb + h * s_gh + q0 * s_gs
            if DQ_TMA:
                dq_out = tl.make_tensor_descriptor(
                    dq_out, [sq, HEAD_DIM], [s_gs, 1], [BLOCK_M, HEAD_PAD]
                )
            dk, dv = _query_tiles(
                dk,
                dv,
                k,
                v,
                q_desc,
                do_desc,
                lse_base,
                delta_base,
                dq_out,
                s_gs,
                offs_n,
                lo,
                mid,
                sq,
                offset,
                qk_scale,
                sm_scale,
                True,
                HEAD_DIM,
                HEAD_PAD,
                IEEE,
                DQ_TMA,
                BLOCK_M,
            )
            dk, dv = _query_tiles(
                dk,
                dv,
                k,
                v,
                q_desc,
                do_desc,
                lse_base,
                delta_base,
                dq_out,
                s_gs,
                offs_n,
                mid,
                sq,
                sq,
                offset,
                qk_scale,
                sm_scale,
                False,
                HEAD_DIM,
                HEAD_PAD,
                IEEE,
                DQ_TMA,
                BLOCK_M,
            )
        out = b * s_tb + k0 * s_ts + hk * s_th
        dk_desc = tl.make_tensor_descriptor(
            DK + out, [skv, HEAD_DIM], [s_ts, 1], [BLOCK_N, HEAD_PAD]
        )
        dv_desc = tl.make_tensor_descriptor(
            DV + out, [skv, HEAD_DIM], [s_ts, 1], [BLOCK_N, HEAD_PAD]
        )
        dk_desc.store([start_n, 0], (dk * sm_scale).to(DK.dtype.element_ty))
        dv_desc.store([start_n, 0], dv.to(DV.dtype.element_ty))
