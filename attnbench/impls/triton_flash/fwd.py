"""Forward kernel of ``triton_flash``: tensor descriptors, a persistent grid, heaviest tiles first.

One program walks work tiles ``t = pid, pid + nprog, ...``; a tile is (query block, sequence,
q head). Causal tiles are handed out from the last query block down, so the longest tiles
start first and the short ones fill the tail (on a GPU: fewer idle SMs at the end).

Per tile: Q, K, V are read and O written through 2-D tensor descriptors ``[seq_len, D]`` built
in the kernel, one per (sequence, head); on sm90 they become TMA copies, elsewhere (and in
the interpreter) masked loads. The descriptor zero-fills rows past the sequence end and the
columns between the head dim ``HEAD_DIM`` and the power-of-two tile width ``HEAD_PAD``, so
any head dim that is a multiple of 8 works with no masks on the loads.

Online softmax in log2 units: ``qk_scale`` is the softmax scale times log2(e), so every
exponential is ``exp2``. The main (unmasked) loop can run as a two-stage ping-pong
(``PIPELINE``): the scores of key tile j+1 are computed before the softmax of tile j, so the
tensor cores have the next QK^T in flight while the softmax runs.

Variants (constexpr flags; ``tuning.FLAGS`` has their defaults, the kernel as tuned):
``ONE_LOOP`` runs every key tile in one masked loop instead of unmasked-then-masked; ``WS``
asks Triton to warp-specialize that loop (sm90, 4 warps: a TMA producer warpgroup beside two
consumers, 12 warps in all); ``PERSISTENT`` off launches one program per tile.

Causal rule with a diagonal offset: query i sees key j iff ``j <= i + offset``, where offset
is ``causal_offset`` (+ ``seq_kv - seq_q`` per sequence when ``ALIGN_END``). A query row that
sees no key has output 0 and log-sum-exp -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    # fp32 inputs: IEEE products (tl.dot would use tf32 on the GPU by default)
    if IEEE:
        r = tl.dot(a, b, acc, input_precision="ieee")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def seq_bounds(CU, b, S, VARLEN: tl.constexpr):
    """(first row, length) of sequence b: packed (cumulative lengths in CU) or dense."""
    if VARLEN:
        start = tl.load(CU + b)
        length = tl.load(CU + b + 1) - start
    else:
        start = b * 0
        length = S + b * 0
    return start, length


@triton.jit
def _scores(q, k_desc, n, IEEE: tl.constexpr, BLOCK_N: tl.constexpr):
    k = k_desc.load([n, 0])  # (BN, DP)
    zero = tl.zeros([q.shape[0], BLOCK_N], tl.float32)
    return _dot(q, tl.trans(k), zero, IEEE)  # (BM, BN), unscaled


@triton.jit
def _softmax_step(
    acc,
    m_i,
    l_i,
    s,
    v,
    offs_m,
    n,
    skv,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    s = s * qk_scale  # log2 units
    if MASKED:
        offs_n = n + tl.arange(0, BLOCK_N)
        keep = (offs_n < skv)[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + offset)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:  # a row with no visible key yet: keep exp2 away from (-inf) - (-inf)
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    alpha = tl.exp2(m_i - m_new_safe)
    p = tl.exp2(s - m_new_safe[:, None])  # (BM, BN)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE)  # (BM, DP)
    return acc, m_new, l_i


@triton.jit
def _attend(
    acc,
    m_i,
    l_i,
    q,
    k_desc,
    v_desc,
    offs_m,
    lo,
    hi,
    skv,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    WS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Key tiles [lo, hi), one after the other. ``WS`` asks Triton to warp-specialize the loop
    (a TMA producer warpgroup beside consumer warpgroups); Triton >= 3.6 does so on sm90 only
    for the one-loop forward (``ONE_LOOP``) and with 4 warps (with 8 it skips it silently)."""
    for n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        s = _scores(q, k_desc, n, IEEE, BLOCK_N)
        v = v_desc.load([n, 0])  # (BN, DP)
        acc, m_i, l_i = _softmax_step(
            acc, m_i, l_i, s, v, offs_m, n, skv, offset, qk_scale, MASKED, CAUSAL, IEEE, BLOCK_N
        )
    return acc, m_i, l_i


@triton.jit
def _attend_pingpong(
    acc,
    m_i,
    l_i,
    q,
    k_desc,
    v_desc,
    offs_m,
    lo,
    hi,
    skv,
    offset,
    qk_scale,
    IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Unmasked key tiles [lo, hi) with the scores of tile j+1 issued before the softmax of
    tile j. The last iteration computes one tile past hi (zero-filled or unmasked-but-unused
    keys) and drops it: one extra QK^T per query tile, bought for the overlap."""
    if lo < hi:
        s = _scores(q, k_desc, lo, IEEE, BLOCK_N)
        for n in range(lo, hi, BLOCK_N):
            s_next = _scores(q, k_desc, n + BLOCK_N, IEEE, BLOCK_N)
            v = v_desc.load([n, 0])  # (BN, DP)
            acc, m_i, l_i = _softmax_step(
                acc, m_i, l_i, s, v, offs_m, n, skv, 0, qk_scale, False, False, IEEE, BLOCK_N
            )
            s = s_next
    return acc, m_i, l_i


@triton.jit
def _fwd_tile(
    Q,
    K,
    V,
    O,
    LSE,
    b,
    h,
    hk,
    q0,
    sq,
    k0,
    skv,
    start_m,
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
    s_lb,
    s_lh,
    qk_scale,
    offset,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    PIPELINE: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    WS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    q_desc = tl.make_tensor_descriptor(
        Q + b * s_qb + q0 * s_qs + h * s_qh, [sq, HEAD_DIM], [s_qs, 1], [BLOCK_M, HEAD_PAD]
    )
    k_desc = tl.make_tensor_descriptor(
        K + b * s_kb + k0 * s_ks + hk * s_kh, [skv, HEAD_DIM], [s_ks, 1], [BLOCK_N, HEAD_PAD]
    )
    v_desc = tl.make_tensor_descriptor(
        V + b * s_vb + k0 * s_vs + hk * s_vh, [skv, HEAD_DIM], [s_vs, 1], [BLOCK_N, HEAD_PAD]
    )
    q = q_desc.load([start_m, 0])  # (BM, DP)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    if CAUSAL:
        # the tile's last row sees keys < start_m + BM + offset; its first row sees every
        # key of the tiles that end at or before start_m + offset + 1
        hi = tl.maximum(tl.minimum(skv, start_m + BLOCK_M + offset), 0)
        full_end = (tl.maximum(tl.minimum(start_m + offset + 1, skv), 0) // BLOCK_N) * BLOCK_N
    else:
        hi = skv
        full_end = (skv // BLOCK_N) * BLOCK_N
    if ONE_LOOP:
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, k_desc, v_desc, offs_m, 0, hi, skv, offset, qk_scale, True, CAUSAL,
            IEEE, WS, BLOCK_N,
        )  # fmt: skip
    else:  # unmasked tiles, then the masked ones
        if PIPELINE:
            acc, m_i, l_i = _attend_pingpong(
                acc, m_i, l_i, q, k_desc, v_desc, offs_m, 0, full_end, skv, offset, qk_scale,
                IEEE, BLOCK_N,
            )  # fmt: skip
        else:
            acc, m_i, l_i = _attend(
                acc, m_i, l_i, q, k_desc, v_desc, offs_m, 0, full_end, skv, offset, qk_scale,
                False, CAUSAL, IEEE, False, BLOCK_N,
            )  # fmt: skip
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, k_desc, v_desc, offs_m, full_end, hi, skv, offset, qk_scale, True,
            CAUSAL, IEEE, False, BLOCK_N,
        )  # fmt: skip
    seen = l_i > 0.0  # false only for rows that see no key (causal offset < 0)
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_desc = tl.make_tensor_descriptor(
        O + b * s_ob + q0 * s_os + h * s_oh, [sq, HEAD_DIM], [s_os, 1], [BLOCK_M, HEAD_PAD]
    )
    o_desc.store([start_m, 0], out.to(O.dtype.element_ty))  # rows >= sq, cols >= D: dropped
    lse = tl.where(seen, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("-inf"))  # natural
    tl.store(LSE + b * s_lb + h * s_lh + q0 + offs_m, lse, mask=offs_m < sq)


@triton.jit
def _fwd_work(
    t, n_m, n_bh, Q, K, V, O, LSE, CU_Q, CU_K,
    s_qb, s_qh, s_qs, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_os, s_lb, s_lh,
    Hq, GROUP, Sq, Skv, qk_scale, causal_offset,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    ALIGN_END: tl.constexpr, VARLEN: tl.constexpr, IEEE: tl.constexpr, PIPELINE: tl.constexpr,
    ONE_LOOP: tl.constexpr, WS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Work tile t: query block t // n_bh (the last first when causal), (sequence, q head)
    t % n_bh."""
    mb = t // n_bh
    if CAUSAL:  # heaviest first: the last query block has the most keys to see
        mb = n_m - 1 - mb
    bh = t % n_bh
    b = bh // Hq
    h = bh % Hq
    q0, sq = seq_bounds(CU_Q, b, Sq, VARLEN)
    k0, skv = seq_bounds(CU_K, b, Skv, VARLEN)
    offset = causal_offset
    if ALIGN_END:
        offset += skv - sq
    if mb * BLOCK_M < sq:
        _fwd_tile(
            Q, K, V, O, LSE, b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64),
            q0.to(tl.int64), sq, k0.to(tl.int64), skv, mb * BLOCK_M,
            s_qb, s_qh, s_qs, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_os, s_lb, s_lh,
            qk_scale, offset, HEAD_DIM, HEAD_PAD, CAUSAL, IEEE, PIPELINE, ONE_LOOP, WS,
            BLOCK_M, BLOCK_N,
        )  # fmt: skip


@triton.jit
def fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,
    s_qb, s_qh, s_qs, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_os, s_lb, s_lh,
    n_seq, Hq, GROUP, Sq, Skv, qk_scale, causal_offset, SQ_KEY, SKV_KEY,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    ALIGN_END: tl.constexpr, VARLEN: tl.constexpr, IEEE: tl.constexpr, PIPELINE: tl.constexpr,
    ONE_LOOP: tl.constexpr, WS: tl.constexpr, PERSISTENT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Sq/Skv: the (maximum) lengths; n_seq: batch size, or number of packed sequences.
    ``PERSISTENT``: each program walks tiles pid, pid + nprog, ...; else one tile per
    program (the grid is every tile)."""
    n_m = tl.cdiv(Sq, BLOCK_M)
    n_bh = n_seq * Hq
    if PERSISTENT:
        for t in range(tl.program_id(0), n_m * n_bh, tl.num_programs(0)):
            _fwd_work(
                t, n_m, n_bh, Q, K, V, O, LSE, CU_Q, CU_K,
                s_qb, s_qh, s_qs, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_os, s_lb,
                s_lh, Hq, GROUP, Sq, Skv, qk_scale, causal_offset, HEAD_DIM, HEAD_PAD, CAUSAL,
                ALIGN_END, VARLEN, IEEE, PIPELINE, ONE_LOOP, WS, BLOCK_M, BLOCK_N,
            )  # fmt: skip
    else:
        _fwd_work(
            tl.program_id(0), n_m, n_bh, Q, K, V, O, LSE, CU_Q, CU_K,
            s_qb, s_qh, s_qs, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh, s_os, s_lb, s_lh,
            Hq, GROUP, Sq, Skv, qk_scale, causal_offset, HEAD_DIM, HEAD_PAD, CAUSAL, ALIGN_END,
            VARLEN, IEEE, PIPELINE, ONE_LOOP, WS, BLOCK_M, BLOCK_N,
        )  # fmt: skip
