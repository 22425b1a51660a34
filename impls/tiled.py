"""Our blocked attention in plain PyTorch: FlashAttention's algorithm without a custom kernel.

Forward: for each query block, loop over key blocks keeping a running max ``m`` and running
sum ``l`` (online softmax, float32), rescaling the accumulator; keys past the causal diagonal
are skipped block-wise. Only the output and the per-row log-sum-exp are saved.
Backward (hand-written): scores are recomputed block by block from the saved log-sum-exp.
Extra memory is O(block_q · block_k) for scores plus O(S) for out / lse / grads, so it grows
linearly in the sequence length; the (Sq, Skv) matrix never exists.
GQA without copies: q is viewed as (B, Hkv, G, Sq, D) and k/v broadcast over G.
"""
import torch

from attnbench.registry import register

BLOCK_Q = 128
BLOCK_K = 256


def _blocks(n: int, size: int):
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _key_end(causal: bool, q_end: int, seq_kv: int) -> int:
    # top-left causal: row i sees keys j <= i, so the block of rows < q_end needs keys < q_end
    return min(seq_kv, q_end) if causal else seq_kv


def _scores(qb, kb, scale, causal, q0, k0):
    """Scaled scores of a block in float32, causal-masked: (B, Hkv, G, bq, bk)."""
    s = (qb @ kb.transpose(-1, -2)).float() * scale
    if causal and k0 + kb.shape[-2] - 1 > q0:  # the block crosses the diagonal
        i = torch.arange(q0, q0 + qb.shape[-2], device=s.device)[:, None]
        j = torch.arange(k0, k0 + kb.shape[-2], device=s.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return s


class TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        B, Hq, Sq, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
        q5 = q.reshape(B, Hkv, Hq // Hkv, Sq, D)  # (B, Hkv, G, Sq, D)
        k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Skv, D)
        out = torch.empty_like(q5)
        lse = torch.empty(q5.shape[:-1], dtype=torch.float32, device=q.device)  # (B, Hkv, G, Sq)
        for q0, q1 in _blocks(Sq, BLOCK_Q):
            qb = q5[..., q0:q1, :]
            m = torch.full(qb.shape[:-1], float("-inf"), device=q.device)  # (B, Hkv, G, bq)
            l = torch.zeros_like(m)
            acc = torch.zeros(qb.shape, dtype=torch.float32, device=q.device)
            for k0, k1 in _blocks(_key_end(causal, q1, Skv), BLOCK_K):
                s = _scores(qb, k5[..., k0:k1, :], scale, causal, q0, k0)
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])  # (B, Hkv, G, bq, bk)
                correction = torch.exp(m - m_new)
                l = l * correction + p.sum(dim=-1)
                acc = acc * correction[..., None] + (p.to(v.dtype) @ v5[..., k0:k1, :]).float()
                m = m_new
            out[..., q0:q1, :] = (acc / l[..., None]).to(q.dtype)
            lse[..., q0:q1] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out.reshape(B, Hq, Sq, D)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out5, lse = ctx.saved_tensors
        causal, scale = ctx.causal, ctx.scale
        B, Hq, Sq, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
        q5 = q.reshape(out5.shape)  # (B, Hkv, G, Sq, D)
        do5 = dout.reshape(out5.shape)
        k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Skv, D)
        delta = (do5.float() * out5.float()).sum(dim=-1)  # (B, Hkv, G, Sq)
        dq = torch.zeros(q5.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)  # (B, Hkv, Skv, D)
        dv = torch.zeros_like(dk)
        for q0, q1 in _blocks(Sq, BLOCK_Q):
            qb, dob = q5[..., q0:q1, :], do5[..., q0:q1, :]
            for k0, k1 in _blocks(_key_end(causal, q1, Skv), BLOCK_K):
                kb, vb = k5[..., k0:k1, :], v5[..., k0:k1, :]
                s = _scores(qb, kb, scale, causal, q0, k0)
                p = torch.exp(s - lse[..., q0:q1, None])  # (B, Hkv, G, bq, bk)
                dv[..., k0:k1, :] += (p.to(q.dtype).transpose(-1, -2) @ dob).float().sum(2)
                dp = (dob @ vb.transpose(-1, -2)).float()
                ds = (p * (dp - delta[..., q0:q1, None]) * scale).to(q.dtype)
                dq[..., q0:q1, :] += (ds @ kb).float()
                dk[..., k0:k1, :] += (ds.transpose(-1, -2) @ qb).float().sum(2)
        return (dq.reshape(B, Hq, Sq, D).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None, None)


@register("tiled", description="our blocked online-softmax attention in plain PyTorch, "
                               "hand-written backward; memory linear in sequence length")
def tiled(q, k, v, *, causal, scale):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D)
    return TiledAttention.apply(q, k, v, causal, scale)
