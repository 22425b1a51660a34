"""FlexAttention over a paged KV cache, as paged-attention servers keep it.

The harness hands a ``paged=True`` impl its keys and values as page pools
(pages, page_tokens, Hkv, D) with a block table (B, P): logical page p of sequence b lives in
pool page ``block_table[b, p]``, pages shuffled (run/measuring/inputs.py ``paged``); ``seq_kv`` is
the logical key length. Here the pools are viewed, without a copy, as one long physical sequence
(1, Hkv, pages * page_tokens, D). A block mask whose key blocks are the pages sends each query
block to its own sequence's pages only; a mask_mod maps a physical key back to its logical
position for the causal, window and padding rules (masks.interval). Pages that every query
of a block sees whole are "full" blocks (no mask_mod applied), so what paging costs is the
indirection itself. The block mask is built once per row, outside the timing. Forward only:
a KV cache is read, not trained.
"""

import torch
from torch.nn.attention.flex_attention import BlockMask

from attnbench.errors import one_line
from attnbench.impls.flex import _flex
from attnbench.masks import ALIGNS, interval, key_bounds, reach
from attnbench.registry import Unsupported, register

Q_BLOCK = 128


def _pages_seen(mask, B: int, Sq: int, Skv: int, page: int, causal: bool, device):
    """Per (batch, query block, logical page): touched by some query, and seen whole by
    every query of the block: two bool (B, nQ, P)."""
    P = -(-Skv // page)
    starts = torch.arange(P, device=device) * page  # (P,)
    ends = torch.clamp(starts + page, max=Skv)
    touched, full = [], []
    for q0 in range(0, Sq, Q_BLOCK):
        lo, hi = key_bounds(
            torch.arange(q0, min(q0 + Q_BLOCK, Sq), device=device),
            Skv,
            causal=causal,
            window=mask.window,
            kv_lens=mask.kv_lens,
            shift=mask.shift(Sq, Skv),
        )  # (1, n), (Bm, n)
        lo, hi = lo.expand(B, -1), hi.expand(B, -1)  # (B, n)
        lo_min, lo_max = lo.min(-1).values[:, None], lo.max(-1).values[:, None]  # (B, 1)
        hi_min, hi_max = hi.min(-1).values[:, None], hi.max(-1).values[:, None]
        touched.append((starts < hi_max) & (ends > lo_min))  # (B, P)
        # a page with a tail beyond Skv is never full: the tail must be masked
        full.append((starts >= lo_max) & (ends <= hi_min) & (ends - starts == page))
    return torch.stack(touched, 1), torch.stack(full, 1)


def _block_indices(pick, table, n_pages: int):
    """(B, nQ, P) bool of logical pages -> counts (B, 1, nQ) and pool page indices
    (B, 1, nQ, n_pages), the picked ones first (the rest is never read)."""
    order = torch.argsort((~pick).to(torch.int8), dim=-1, stable=True)  # picked first
    idx = table[:, None, :].expand_as(pick).gather(-1, order)  # (B, nQ, P)
    out = torch.zeros(*pick.shape[:2], n_pages, dtype=torch.int32, device=pick.device)
    out[..., : idx.shape[-1]] = idx
    return pick.sum(-1, dtype=torch.int32)[:, None], out[:, None]


def block_mask(q, k_pool, block_table, causal, mask, seq_kv: int) -> BlockMask:
    # q (B, Hq, Sq, D); k_pool (pages, page_tokens, Hkv, D); block_table (B, P) int32
    B, Sq = q.shape[0], q.shape[2]
    n_pages, page = k_pool.shape[0], k_pool.shape[1]

    def make():
        dev = q.device
        table = block_table.long()
        P = table.shape[1]
        logical = torch.full((B, n_pages), -1, dtype=torch.long, device=dev)  # pool -> page
        logical.scatter_(1, table, torch.arange(P, device=dev).expand(B, P).contiguous())
        back, ahead = (torch.tensor(n, device=dev) for n in reach(causal, mask.window))
        shift = torch.tensor(mask.shift(Sq, seq_kv), device=dev)
        kv_len = (
            mask.kv_lens if mask.kv_lens is not None else torch.full((B,), seq_kv, device=dev)
        )  # (B,)

        def mask_mod(b, h, q_idx, kv_idx):
            p = logical[b, kv_idx // page]  # this sequence's logical page, or -1
            j = p * page + kv_idx % page  # the key's logical position
            lo, hi = interval(q_idx + shift, back=back, ahead=ahead, kv_len=kv_len[b])
            return (p >= 0) & (j >= lo) & (j < hi)

        touched, full = _pages_seen(mask, B, Sq, seq_kv, page, causal, dev)
        kv_num, kv_idx = _block_indices(touched & ~full, table, n_pages)
        full_num, full_idx = _block_indices(full, table, n_pages)
        return BlockMask.from_kv_blocks(
            kv_num,
            kv_idx,
            full_num,
            full_idx,
            BLOCK_SIZE=(Q_BLOCK, page),
            mask_mod=mask_mod,
            seq_lengths=(Sq, n_pages * page),
        )

    return mask.cached(("flex_paged", causal, B, Sq, seq_kv, str(q.device)), make)


@register(
    "flex_paged",
    color="#c49c94",
    masks=("padding", "window"),  # the interval kinds: its mask_mod is rules.interval
    causal_align=ALIGNS,
    paged=True,
    backward=False,
    compiled=True,
    description="flex_attention reading a paged KV cache (shuffled pages, block table)",
)
def flex_paged(q, k, v, *, causal, scale, mask, block_table, seq_kv):
    # q (B, Hq, Sq, D); k, v pools (pages, page_tokens, Hkv, D) -> (B, Hq, Sq, D)
    B = q.shape[0]
    n_pages, page, Hkv, D = k.shape
    # the pools as one physical sequence, a view: (B, Hkv, pages * page_tokens, D), batch
    # broadcast (stride 0)
    kk, vv = (
        t.view(n_pages * page, Hkv, D).permute(1, 0, 2)[None].expand(B, -1, -1, -1) for t in (k, v)
    )
    try:
        return _flex(
            q,
            kk,
            vv,
            block_mask=block_mask(q, k, block_table, causal, mask, seq_kv),
            scale=scale,
            enable_gqa=q.shape[1] != Hkv,
        )
    except NotImplementedError as exc:  # FlexAttention refuses the case
        raise Unsupported(one_line(exc)) from exc
