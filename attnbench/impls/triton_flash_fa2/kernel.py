"""FlashAttention-2 style attention in Triton: forward and backward.

Layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D); Hq % Hkv == 0 and query
head h reads key/value head h // (Hq // Hkv) (GQA/MQA by index arithmetic, k/v never copied).
Causal is SDPA's ``is_causal``: top-left aligned, query i sees keys j <= i.

Forward: one program per (query tile, batch * head). It walks the key/value tiles with an
online softmax in float32 (running max m, running sum l, accumulator rescaled by
exp2(m_old - m_new)); the score tile lives in registers only. Scores are kept in log2 units
(log2(e) is folded into the softmax scale, so exp2 replaces exp). The log-sum-exp per row
(natural log, float32, (B, Hq, Sq)) is saved for the backward.

Backward: delta = rowsum(dO * O) (one small kernel), then
  * dq kernel: one program per (query tile, batch * q head), loop over key tiles;
  * dk/dv kernel: one program per (key tile, batch * kv head), loop over the q heads of the
    group and, for each, over query tiles; the group's contributions are summed in registers,
    so GQA needs no atomics and no expanded copies.
P is recomputed from the saved LSE: P = exp2(S * scale * log2(e) - LSE * log2(e)).

Causal tiles: each loop is split into a phase of tiles that need no mask at all and a phase of
tiles that touch the diagonal or the ragged end (masked elementwise); tiles that are fully
masked are never visited (loop bounds).

Tuning: on a GPU every kernel is wrapped in ``triton.autotune`` keyed on (Sq and Skv rounded
up to a power of two, head dim, causal, dtypes); the first call of a new key benchmarks the
configs (seconds), so time only after a warm-up call. Under ``TRITON_INTERPRET=1`` (the CPU
interpreter, used by the tests) autotuning is bypassed and ``INTERPRET_TILES`` is used.

Importing this module imports triton; ``__init__.py`` beside it imports it lazily.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch
import triton
import triton.language as tl

HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (BLOCK_M, BLOCK_N) used when interpreting or when a caller passes tiles= (no autotune).
INTERPRET_TILES = (32, 16)
LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    # fp32 inputs: IEEE products (tl.dot would use tf32 on the GPU by default)
    if IEEE:
        r = tl.dot(a, b, acc, input_precision="ieee")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def _fwd_loop(
    acc,
    m_i,
    l_i,
    q,
    k_base,
    v_base,
    s_ks,
    s_vs,
    offs_m,
    offs_d,
    lo,
    hi,
    Skv,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :] * s_ks + offs_d[:, None]  # (D, BN)
        v_ptrs = v_base + offs_n[:, None] * s_vs + offs_d[None, :]  # (BN, D)
        if MASKED:
            col_ok = offs_n < Skv
            kt = tl.load(kt_ptrs, mask=col_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, kt, tl.zeros([q.shape[0], BLOCK_N], tl.float32), IEEE) * qk_scale  # (BM, BN)
        if MASKED:
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every row sees key 0 first
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # (BM, BN)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    s_qb,
    s_qh,
    s_qs,
    s_kb,
    s_kh,
    s_ks,
    s_vb,
    s_vh,
    s_vs,
    s_ob,
    s_oh,
    s_os,
    Hq,
    GROUP,
    Sq,
    Skv,
    qk_scale,
    SQ_KEY,
    SKV_KEY,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Sq
    q = tl.load(
        Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # (BM, D)
    k_base = K + b * s_kb + hk * s_kh
    v_base = V + b * s_vb + hk * s_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        hi = tl.minimum(Skv, start_m + BLOCK_M)  # keys past the tile's last row are skipped
        full_end = (tl.minimum(start_m, Skv) // BLOCK_N) * BLOCK_N
    else:
        hi = Skv
        full_end = (Skv // BLOCK_N) * BLOCK_N
    acc, m_i, l_i = _fwd_loop(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        s_ks,
        s_vs,
        offs_m,
        offs_d,
        0,
        full_end,
        Skv,
        qk_scale,
        False,
        CAUSAL,
        IEEE,
        BLOCK_N,
    )
    acc, m_i, l_i = _fwd_loop(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        s_ks,
        s_vs,
        offs_m,
        offs_d,
        full_end,
        hi,
        Skv,
        qk_scale,
        True,
        CAUSAL,
        IEEE,
        BLOCK_N,
    )
    out = acc / l_i[:, None]
    tl.store(
        O + b * s_ob + h * s_oh + offs_m[:, None] * s_os + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=row_ok[:, None],
    )
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # log2 units -> natural log
    tl.store(LSE + bh.to(tl.int64) * Sq + offs_m, lse, mask=row_ok)


@triton.jit
def _bwd_delta_kernel(
    O,
    DO,
    DELTA,
    s_ob,
    s_oh,
    s_os,
    s_db,
    s_dh,
    s_ds,
    Hq,
    Sq,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Sq
    o = tl.load(
        O + b * s_ob + h * s_oh + offs_m[:, None] * s_os + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    ).to(tl.float32)  # (BM, D)
    do = tl.load(
        DO + b * s_db + h * s_dh + offs_m[:, None] * s_ds + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    ).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * Sq + offs_m, tl.sum(o * do, 1), mask=row_ok)


@triton.jit
def _dq_loop(
    dq,
    q,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    s_ks,
    s_vs,
    offs_m,
    offs_d,
    lo,
    hi,
    Skv,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptrs = k_base + offs_n[None, :] * s_ks + offs_d[:, None]  # (D, BN)
        vt_ptrs = v_base + offs_n[None, :] * s_vs + offs_d[:, None]  # (D, BN)
        if MASKED:
            col_ok = offs_n < Skv
            kt = tl.load(kt_ptrs, mask=col_ok[None, :], other=0.0)
            vt = tl.load(vt_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        zero = tl.zeros([q.shape[0], BLOCK_N], tl.float32)
        s = _dot(q, kt, zero, IEEE) * qk_scale  # (BM, BN)
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = _dot(do, vt, zero, IEEE)  # (BM, BN)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(kt.dtype), tl.trans(kt), dq, IEEE)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
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
    Hq,
    GROUP,
    Sq,
    Skv,
    qk_scale,
    sm_scale,
    SQ_KEY,
    SKV_KEY,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Sq
    q = tl.load(
        Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qs + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # (BM, D)
    do = tl.load(
        DO + b * s_db + h * s_dh + offs_m[:, None] * s_ds + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # (BM, D)
    lse2 = tl.load(LSE + bh.to(tl.int64) * Sq + offs_m, mask=row_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * Sq + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * s_kb + hk * s_kh
    v_base = V + b * s_vb + hk * s_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        hi = tl.minimum(Skv, start_m + BLOCK_M)
        full_end = (tl.minimum(start_m, Skv) // BLOCK_N) * BLOCK_N
    else:
        hi = Skv
        full_end = (Skv // BLOCK_N) * BLOCK_N
    dq = _dq_loop(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        s_ks,
        s_vs,
        offs_m,
        offs_d,
        0,
        full_end,
        Skv,
        qk_scale,
        False,
        CAUSAL,
        IEEE,
        BLOCK_N,
    )
    dq = _dq_loop(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        s_ks,
        s_vs,
        offs_m,
        offs_d,
        full_end,
        hi,
        Skv,
        qk_scale,
        True,
        CAUSAL,
        IEEE,
        BLOCK_N,
    )
    tl.store(
        DQ + b * s_gb + h * s_gh + offs_m[:, None] * s_gs + offs_d[None, :],
        (dq * sm_scale).to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )


@triton.jit
def _dkdv_loop(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    s_qs,
    s_ds,
    offs_n,
    offs_d,
    lo,
    hi,
    Sq,
    qk_scale,
    MASKED: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Sq
        qt = tl.load(
            q_base + offs_m[None, :] * s_qs + offs_d[:, None], mask=row_ok[None, :], other=0.0
        )  # (D, BM)
        do = tl.load(
            do_base + offs_m[:, None] * s_ds + offs_d[None, :], mask=row_ok[:, None], other=0.0
        )  # (BM, D)
        # rows past Sq: LSE = +inf makes their P exactly 0
        lse2 = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        zero = tl.zeros([k.shape[0], BLOCK_M], tl.float32)
        pt = tl.exp2(_dot(k, qt, zero, IEEE) * qk_scale - lse2[None, :])  # (BN, BM)
        if MASKED:  # causal diagonal: query i sees key j iff j <= i
            pt = tl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        dv = _dot(pt.to(do.dtype), do, dv, IEEE)  # (BN, D)
        dpt = _dot(v, tl.trans(do), zero, IEEE)  # (BN, BM)
        dst = pt * (dpt - delta[None, :])
        dk = _dot(dst.to(qt.dtype), tl.trans(qt), dk, IEEE)  # (BN, D)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
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
    Hq,
    Hkv,
    GROUP,
    Sq,
    Skv,
    qk_scale,
    sm_scale,
    SQ_KEY,
    SKV_KEY,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)
    hk = (bhk % Hkv).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < Skv
    k = tl.load(
        K + b * s_kb + hk * s_kh + offs_n[:, None] * s_ks + offs_d[None, :],
        mask=col_ok[:, None],
        other=0.0,
    )  # (BN, D)
    v = tl.load(
        V + b * s_vb + hk * s_vh + offs_n[:, None] * s_vs + offs_d[None, :],
        mask=col_ok[:, None],
        other=0.0,
    )  # (BN, D)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # causal: query tiles before lo see none of these keys; from diag_end on they see all
    lo = (start_n // BLOCK_M) * BLOCK_M
    diag_end = tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M
    for g in range(GROUP):  # the q heads sharing this kv head
        h = hk * GROUP + g
        q_base = Q + b * s_qb + h * s_qh
        do_base = DO + b * s_db + h * s_dh
        row_base = (b * Hq + h) * Sq
        if CAUSAL:
            dk, dv = _dkdv_loop(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                LSE + row_base,
                DELTA + row_base,
                s_qs,
                s_ds,
                offs_n,
                offs_d,
                lo,
                tl.minimum(diag_end, Sq),
                Sq,
                qk_scale,
                True,
                IEEE,
                BLOCK_M,
            )
            dk, dv = _dkdv_loop(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                LSE + row_base,
                DELTA + row_base,
                s_qs,
                s_ds,
                offs_n,
                offs_d,
                diag_end,
                Sq,
                Sq,
                qk_scale,
                False,
                IEEE,
                BLOCK_M,
            )
        else:
            dk, dv = _dkdv_loop(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                LSE + row_base,
                DELTA + row_base,
                s_qs,
                s_ds,
                offs_n,
                offs_d,
                0,
                Sq,
                Sq,
                qk_scale,
                False,
                IEEE,
                BLOCK_M,
            )
    out = b * s_gb + hk * s_gh + offs_n[:, None] * s_gs + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


# ---------------------------------------------------------------------------------- tuning


def interpreting() -> bool:
    """True when the kernels were built for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_fwd_kernel, triton.runtime.jit.JITFunction)


def _max_smem() -> int:
    try:
        dev = torch.cuda.current_device()
        return int(triton.runtime.driver.active.utils.get_device_properties(dev)["max_shared_mem"])
    except Exception:  # noqa: BLE001 - unknown: assume the smallest of sm80/sm90
        return 163 * 1024


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# (BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_M tiles queries, BLOCK_N tiles keys.
_BASE = {
    "fwd": [
        (64, 32, 4, 3),
        (64, 64, 4, 3),
        (128, 32, 4, 3),
        (128, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (64, 32, 8, 2),
        (64, 64, 8, 2),
    ],
    "dq": [
        (64, 32, 4, 3),
        (64, 64, 4, 3),
        (128, 32, 4, 3),
        (128, 64, 8, 3),
        (64, 32, 8, 2),
        (64, 64, 8, 2),
    ],
    "dkdv": [
        (32, 64, 4, 3),
        (32, 128, 8, 2),
        (64, 64, 4, 3),
        (64, 128, 8, 2),
        (32, 32, 4, 2),
        (32, 64, 8, 2),
        (32, 64, 8, 3),
        (32, 32, 8, 2),
        (16, 32, 8, 2),
    ],
}
# sm90 (228 KB shared memory per SM): deeper pipelines and 128-wide tiles.
_HOPPER = {
    "fwd": [(128, 128, 8, 3), (128, 64, 8, 4)],
    "dq": [(128, 64, 8, 4), (128, 128, 8, 2)],
    "dkdv": [(64, 128, 8, 3), (32, 128, 8, 3)],
}


# Configs that spilled registers when compiled for sm90 (bf16) by triton 3.6 or 3.9 although
# the estimates above let them through (compile_check.py, both versions): (kind, head dim) ->
# (BLOCK_M, BLOCK_N, warps, stages). Register allocation differs between Triton versions, so
# no single threshold in _registers_ok covers them.
_SPILLS = {
    ("fwd", 128): {(128, 128, 8, 2), (128, 128, 8, 3)},
    ("fwd", 256): {(128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 8, 2)},
    ("dq", 128): {(128, 64, 8, 4)},
    ("dq", 256): {(128, 64, 8, 4), (64, 64, 8, 2)},
    ("dkdv", 16): {(64, 128, 8, 2), (16, 32, 8, 2)},
    ("dkdv", 32): {(64, 64, 4, 3), (64, 128, 8, 2), (32, 32, 8, 2)},
    ("dkdv", 64): {(64, 64, 4, 3), (64, 128, 8, 2)},
    ("dkdv", 128): {(32, 64, 8, 3)},
}


def _spills(kind: str, c, d: int) -> bool:
    tile = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
    return tile in _SPILLS.get((kind, d), ())


def _configs(kind: str) -> list:
    tiles = _BASE[kind] + (_HOPPER[kind] if _is_hopper() else [])
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in tiles
    ]


def _smem_bytes(kind: str, m: int, n: int, stages: int, d: int, elt: int) -> int:
    """Shared memory of a config: resident tiles + streamed tiles x stages. Matches what
    Triton 3.9 allocates for sm90 with 16-byte aligned arguments (checked offline by
    compiling every config in _BASE/_HOPPER for head dims 64, 128, 256)."""
    if kind == "fwd":  # streamed: k, v
        return elt * d * (m + 2 * n * stages)
    if kind == "dq":  # resident: q, dO; streamed: k, v
        return elt * d * (2 * m + 2 * n * stages)
    return elt * d * (2 * n + 2 * m * stages) + 8 * m * stages  # streamed: q, dO, lse, delta


def _registers_ok(kind: str, m: int, n: int, warps: int, d: int) -> bool:
    """fp32 accumulator (acc, dq, or dk + dv) and score-tile elements per thread. Compiled for
    sm90, configs above these limits spilled registers in the offline check."""
    threads = 32 * warps
    acc = (2 * n * d if kind == "dkdv" else m * d) // threads
    return acc <= 64 and (m * n) // threads <= (64 if kind == "fwd" else 32)


def _prune(kind: str):
    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        d, elt = args["HEAD_DIM"], args["Q"].element_size()
        limit = _max_smem()
        keep = [
            c
            for c in configs
            if _smem_bytes(kind, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, d, elt)
            <= limit
            and _registers_ok(kind, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, d)
            and not _spills(kind, c, d)
        ]
        if keep:
            return keep
        # nothing fits the estimates: keep the smallest tiles
        return [
            min(
                configs,
                key=lambda c: (
                    c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"],
                    c.num_stages,
                    -c.num_warps,
                ),
            )
        ]

    return prune


_KERNELS = {"fwd": _fwd_kernel, "dq": _bwd_dq_kernel, "dkdv": _bwd_dkdv_kernel}


# tuning results kept on disk (Triton's cache), so that a new worker process or a later run on
# the same machine does not benchmark every config again (triton >= 3.2 has cache_results)
_AUTOTUNE_CACHE = (
    {"cache_results": True}
    if "cache_results" in inspect.signature(triton.autotune).parameters
    else {}
)


@functools.cache
def _tuned(kind: str):
    return triton.autotune(
        configs=_configs(kind),
        key=["SQ_KEY", "SKV_KEY", "HEAD_DIM", "CAUSAL"],  # + arg dtypes
        prune_configs_by={"early_config_prune": _prune(kind)},
        **_AUTOTUNE_CACHE,
    )(_KERNELS[kind])


def _launch(kind: str, grid_fn, args: tuple, consts: dict, tiles):
    """Run a kernel: autotuned on a GPU, with fixed tiles when interpreting or when given."""
    if tiles is None and not interpreting():
        _tuned(kind)[grid_fn](*args, **consts)
        return
    m, n = tiles or INTERPRET_TILES
    meta = {"BLOCK_M": m, "BLOCK_N": n}
    _KERNELS[kind][grid_fn(meta)](*args, **consts, **meta)


def _bucket(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# -------------------------------------------------------------------------------- wrappers


def _check(q, k, v) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-d: q (B, Hq, Sq, D), k/v (B, Hkv, Skv, D)")
    B, Hq, Sq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if Hq % k.shape[1]:
        raise ValueError(f"heads={Hq} must be a multiple of kv_heads={k.shape[1]}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim={D} not supported (supported: {HEAD_DIMS})")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: need one of {DTYPES}")


def _last_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def forward(q, k, v, *, causal: bool, scale: float, tiles=None):
    """Returns (out (B, Hq, Sq, D), lse (B, Hq, Sq) float32, natural log)."""
    _check(q, k, v)
    q, k, v = (_last_contig(t) for t in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, Hq, Sq, D)
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    args = (
        q,
        k,
        v,
        o,
        lse,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *o.stride()[:3],
        Hq,
        Hq // Hkv,
        Sq,
        Skv,
        scale * LOG2E,
        _bucket(Sq),
        _bucket(Skv),
    )
    consts = dict(HEAD_DIM=D, CAUSAL=bool(causal), IEEE=q.dtype == torch.float32)
    _launch("fwd", lambda meta: (triton.cdiv(Sq, meta["BLOCK_M"]), B * Hq), args, consts, tiles)
    return o, lse


def backward(do, q, k, v, o, lse, *, causal: bool, scale: float, tiles=None):
    """Returns (dq, dk, dv) for dout ``do`` (B, Hq, Sq, D); dk/dv summed over each GQA group."""
    do = _last_contig(do)
    q, k, v = (_last_contig(t) for t in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    delta = torch.empty_like(lse)  # (B, Hq, Sq) float32
    bm = 64 if tiles is None and not interpreting() else (tiles or INTERPRET_TILES)[0]
    _bwd_delta_kernel[(triton.cdiv(Sq, bm), B * Hq)](
        o, do, delta, *o.stride()[:3], *do.stride()[:3], Hq, Sq, HEAD_DIM=D, BLOCK_M=bm
    )
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, Hq, Sq, D)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)  # (B, Hkv, Skv, D)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    consts = dict(HEAD_DIM=D, CAUSAL=bool(causal), IEEE=q.dtype == torch.float32)
    keys = (_bucket(Sq), _bucket(Skv))
    _launch(
        "dq",
        lambda meta: (triton.cdiv(Sq, meta["BLOCK_M"]), B * Hq),
        (
            q,
            k,
            v,
            do,
            lse,
            delta,
            dq,
            *strides,
            *dq.stride()[:3],
            Hq,
            Hq // Hkv,
            Sq,
            Skv,
            scale * LOG2E,
            scale,
            *keys,
        ),
        consts,
        tiles,
    )
    _launch(
        "dkdv",
        lambda meta: (triton.cdiv(Skv, meta["BLOCK_N"]), B * Hkv),
        (
            q,
            k,
            v,
            do,
            lse,
            delta,
            dk,
            dv,
            *strides,
            *dk.stride()[:3],
            Hq,
            Hkv,
            Hq // Hkv,
            Sq,
            Skv,
            scale * LOG2E,
            scale,
            *keys,
        ),
        consts,
        tiles,
    )
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, tiles):
        o, lse = forward(q, k, v, causal=causal, scale=scale, tiles=tiles)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.tiles = causal, scale, tiles
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(
            do, q, k, v, o, lse, causal=ctx.causal, scale=ctx.scale, tiles=ctx.tiles
        )
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None, tiles=None):
    """q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> out (B, Hq, Sq, D), differentiable.
    ``tiles=(BLOCK_M, BLOCK_N)`` skips autotuning."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return FlashAttention.apply(q, k, v, bool(causal), float(scale), tiles)
