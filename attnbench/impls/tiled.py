"""Our blocked attention in plain PyTorch: FlashAttention's algorithm without a custom kernel.

Forward: for each query block, loop over key blocks keeping a running max ``m`` and running
sum ``l`` (online softmax, float32), rescaling the accumulator; key blocks that no row of the
query block keeps (past the causal diagonal, outside the window, past every batch's padding,
outside every row's document, outside a sparse pattern's kept blocks: any mask kind's
layout) are skipped, and only blocks that some row masks in part are masked element-wise; a
score modifier (softcap, ALiBi) is applied to each block's scores, its declared derivative
(``grad``) in the backward: with backward, a modifier that declares none is refused
(``score_mod_needs``). Only the output and the per-row log-sum-exp are saved.
Backward (hand-written): scores are recomputed block by block from the saved log-sum-exp.
Extra memory is O(block_q · block_k) for scores plus O(S) for out / lse / grads, so it grows
linearly in the sequence length; the (Sq, Skv) matrix never exists.
GQA without copies: q is viewed as (B, Hkv, G, Sq, D) and k/v broadcast over G.
"""

from dataclasses import dataclass

import torch

from attnbench.masks import ALIGNS, ANY, Layout, ScoreMod, block_keep, key_bounds
from attnbench.registry import register

BLOCK_Q = 128
BLOCK_K = 256


def _blocks(start: int, end: int, size: int):
    return [(s, min(s + size, end)) for s in range(start, end, size)]


def _scaled(qb, kb, scale, q0, k0, shift, mod: ScoreMod | None, grad: bool):
    """Scaled scores of a block in float32, modified by the score modifier: (B, Hkv, G, bq,
    bk); with ``grad`` also d(modified)/d(scores) (None without a modifier)."""
    s = (qb @ kb.transpose(-1, -2)).float() * scale
    if mod is None:
        return s, None
    Hkv, G, bq, bk = s.shape[1:]
    h = torch.arange(Hkv * G, device=s.device).view(1, Hkv, G, 1, 1)
    p = torch.arange(q0, q0 + bq, device=s.device)[:, None] + shift
    j = torch.arange(k0, k0 + bk, device=s.device)[None, :]
    return mod.scores(s, h, p, j), mod.grad(s, h, p, j) if grad else None


@dataclass
class _Masking:
    """Causal, window and key padding, per block."""

    seq_kv: int
    causal: bool
    window: int | None
    kv_lens: torch.Tensor | None  # (B,) on the device
    shift: int = 0  # position of query 0 among the keys (masks.offset)
    mod: ScoreMod | None = None  # the case's score modifier

    def __post_init__(self):
        self.kv_lens_cpu = None if self.kv_lens is None else self.kv_lens.cpu()  # one sync

    def key_range(self, q0: int, q1: int) -> tuple[int, int, int, int]:
        """For query rows q0..q1-1: keys some row keeps, [start, end), and keys every row
        keeps, [full_lo, full_hi). The kept interval only moves right as the row grows."""
        lo, hi = key_bounds(
            torch.tensor([q0, q1 - 1]),
            self.seq_kv,
            causal=self.causal,
            window=self.window,
            kv_lens=self.kv_lens_cpu,
            shift=self.shift,
        )  # (1, 2), (Bm, 2)
        return int(lo[0, 0]), int(hi[:, 1].max()), int(lo[0, 1]), int(hi[:, 0].min())

    def key_tiles(self, q0: int, q1: int) -> list[tuple[int, int, list[int]]]:
        """The key tiles (k0, k1, full) that query rows q0..q1-1 visit; ``full`` is what
        ``scores`` needs to tell a tile that no row masks."""
        start, end, *full = self.key_range(q0, q1)
        return [(k0, k1, full) for k0, k1 in _blocks(start, end, BLOCK_K)]

    def scores(self, qb, kb, scale, q0, k0, full, grad=False):
        """Scaled, modified scores of a block in float32, masked where needed, and their
        gradient factor (``_scaled``): (B, Hkv, G, bq, bk)."""
        s, g = _scaled(qb, kb, scale, q0, k0, self.shift, self.mod, grad)
        k1 = k0 + kb.shape[-2]
        if k0 < full[0] or k1 > full[1]:  # some row of the block masks some of these keys
            keep = block_keep(
                q0,
                q0 + qb.shape[-2],
                k0,
                k1,
                self.seq_kv,
                causal=self.causal,
                window=self.window,
                kv_lens=self.kv_lens,
                device=s.device,
                shift=self.shift,
            )
            s = s.masked_fill(~keep[:, None, None], float("-inf"))  # keep (Bm, 1, 1, bq, bk)
        return s, g


@dataclass
class _LayoutMasking:
    """A mask kind's layout (masks.Layout: packed documents, sparse patterns, a prefix...),
    per tile: tiles it leaves empty are skipped, full ones unmasked, the others masked
    element-wise. The plan of tiles is made once per row (the untimed first call) and kept in
    the row's mask."""

    pattern: Layout
    causal: bool
    mod: ScoreMod | None = None  # the case's score modifier

    def __post_init__(self):
        S = self.pattern.seq_len
        self.plan = {}
        for q0, q1 in _blocks(0, S, BLOCK_Q):
            states = [
                (k0, k1, self.pattern.tile(q0, q1, k0, k1, self.causal))
                for k0, k1 in _blocks(0, S, BLOCK_K)
            ]
            self.plan[q0] = [(k0, k1, st == "full") for k0, k1, st in states if st != "empty"]

    def key_tiles(self, q0: int, q1: int) -> list[tuple[int, int, bool]]:
        return self.plan[q0]

    def scores(self, qb, kb, scale, q0, k0, full, grad=False):
        """As _Masking.scores."""
        s, g = _scaled(qb, kb, scale, q0, k0, 0, self.mod, grad)
        if not full:
            q1, k1 = q0 + qb.shape[-2], k0 + kb.shape[-2]
            keep = self.pattern.keep(q0, q1, k0, k1, self.causal, s.device)  # (Bm, bq, bk)
            s = s.masked_fill(~keep[:, None, None], float("-inf"))  # keep (Bm, 1, 1, bq, bk)
        return s, g


def _masking(seq_q: int, seq_kv: int, causal: bool, mask):
    if mask.pattern is not None:
        return mask.cached(
            ("tiled", causal), lambda: _LayoutMasking(mask.pattern, causal, mask.score_mod)
        )
    return _Masking(
        seq_kv, causal, mask.window, mask.kv_lens, mask.shift(seq_q, seq_kv), mask.score_mod
    )


def work_pairs(case, mask) -> int:
    """(query, key) pairs in the tiles this impl computes, per head, summed over the batch:
    every visited tile whole, masked entries included (work_flops)."""
    masking = _masking(case.seq_q, case.seq_kv, case.causal, mask)
    tiles = [
        (q1 - q0) * (k1 - k0)
        for q0, q1 in _blocks(0, case.seq_q, BLOCK_Q)
        for k0, k1, _ in masking.key_tiles(q0, q1)
    ]
    return case.batch * sum(tiles)


class TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, masking, scale):
        B, Hq, Sq, D = q.shape
        Hkv = k.shape[1]
        q5 = q.reshape(B, Hkv, Hq // Hkv, Sq, D)  # (B, Hkv, G, Sq, D)
        k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Skv, D)
        out = torch.empty_like(q5)
        lse = torch.empty(q5.shape[:-1], dtype=torch.float32, device=q.device)  # (B, Hkv, G, Sq)
        for q0, q1 in _blocks(0, Sq, BLOCK_Q):
            qb = q5[..., q0:q1, :]
            m = torch.full(qb.shape[:-1], float("-inf"), device=q.device)  # (B, Hkv, G, bq)
            l = torch.zeros_like(m)
            acc = torch.zeros(qb.shape, dtype=torch.float32, device=q.device)
            for k0, k1, full in masking.key_tiles(q0, q1):
                s, _ = masking.scores(qb, k5[..., k0:k1, :], scale, q0, k0, full)
                m_new = torch.maximum(m, s.amax(dim=-1))
                # a row with no kept key yet has m_new = -inf: shift by 0 instead (exp -> 0)
                shift = m_new.masked_fill(m_new == float("-inf"), 0.0)
                p = torch.exp(s - shift[..., None])  # (B, Hkv, G, bq, bk)
                correction = torch.exp(m - shift)
                l = l * correction + p.sum(dim=-1)
                acc = acc * correction[..., None] + (p.to(v.dtype) @ v5[..., k0:k1, :]).float()
                m = m_new
            # a row with no key at all (bottom-right, Sq > Skv) has l = 0: output zero, and
            # lse = +inf makes its recomputed probabilities zero in the backward
            out[..., q0:q1, :] = (acc / l.masked_fill(l == 0, 1.0)[..., None]).to(q.dtype)
            lse[..., q0:q1] = torch.where(l > 0, m + torch.log(l), float("inf"))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.masking, ctx.scale = masking, scale
        return out.reshape(B, Hq, Sq, D)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out5, lse = ctx.saved_tensors
        masking, scale = ctx.masking, ctx.scale
        B, Hq, Sq, D = q.shape
        q5 = q.reshape(out5.shape)  # (B, Hkv, G, Sq, D)
        do5 = dout.reshape(out5.shape)
        k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Skv, D)
        delta = (do5.float() * out5.float()).sum(dim=-1)  # (B, Hkv, G, Sq)
        dq = torch.zeros(q5.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)  # (B, Hkv, Skv, D)
        dv = torch.zeros_like(dk)
        for q0, q1 in _blocks(0, Sq, BLOCK_Q):
            qb, dob = q5[..., q0:q1, :], do5[..., q0:q1, :]
            for k0, k1, full in masking.key_tiles(q0, q1):
                kb, vb = k5[..., k0:k1, :], v5[..., k0:k1, :]
                s, g = masking.scores(qb, kb, scale, q0, k0, full, grad=True)
                p = torch.exp(s - lse[..., q0:q1, None])  # (B, Hkv, G, bq, bk)
                dv[..., k0:k1, :] += (p.to(q.dtype).transpose(-1, -2) @ dob).float().sum(2)
                dp = (dob @ vb.transpose(-1, -2)).float()
                ds = p * (dp - delta[..., q0:q1, None])  # d loss / d modified scores
                ds = (ds * scale if g is None else ds * g * scale).to(q.dtype)
                dq[..., q0:q1, :] += (ds @ kb).float()
                dk[..., k0:k1, :] += (ds.transpose(-1, -2) @ qb).float().sum(2)
        return (dq.reshape(B, Hq, Sq, D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None)


@register(
    "tiled",
    color="#d62728",
    masks=ANY,
    score_mods=ANY,
    score_mod_needs=("grad",),  # its backward calls the modifier's grad
    causal_align=ALIGNS,
    work=work_pairs,
    description="our blocked online-softmax attention in plain PyTorch, hand-written "
    "backward; memory linear in sequence length",
)
def tiled(q, k, v, *, causal, scale, mask):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D)
    return TiledAttention.apply(q, k, v, _masking(q.shape[2], k.shape[2], causal, mask), scale)
