"""FlexAttention (torch.nn.attention.flex_attention) through torch.compile, masks as block masks.

One mask_mod serves every mask: query i at position p = i + shift keeps keys
p - back < j < p + ahead and j < kv_len[b] (masks.interval), with shift, back, ahead and
kv_len held in tensors, so causal (either alignment), padding and window cases of one shape
share one compiled graph; the block mask (made once per row, outside the
timing) lets the kernel skip fully masked tiles. Without any mask the block mask is None.
The other kinds (attnbench/masks/) give their layout's ``rule`` as the mask_mod (reading the
document index or the block layout from a tensor), and a score modifier its ``apply`` as the
score_mod.
FlexAttention has no backward on the CPU."""

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attnbench.masks import ALIGNS, ANY, interval, reach
from attnbench.measure.compiling import compile_static
from attnbench.registry import Unsupported, register

_flex = compile_static(flex_attention)


def block_mask(q, k, causal, mask):
    # q (B, Hq, Sq, D); k (B, Hkv, Skv, D)
    if not mask.masked(causal):
        return None
    B, Sq, Skv = q.shape[0], q.shape[-2], k.shape[-2]
    if mask.pattern is not None:
        return mask.cached(
            ("flex", causal, B, Sq, Skv, str(q.device)),
            lambda: pattern_block_mask(mask.pattern, causal, q.device),
        )

    def make():
        back, ahead = (torch.tensor(n, device=q.device) for n in reach(causal, mask.window))
        shift = torch.tensor(mask.shift(Sq, Skv), device=q.device)
        kv_len = (
            mask.kv_lens if mask.kv_lens is not None else torch.full((B,), Skv, device=q.device)
        )  # (B,)

        def mask_mod(b, h, q_idx, kv_idx):
            lo, hi = interval(q_idx + shift, back=back, ahead=ahead, kv_len=kv_len[b])
            return (kv_idx >= lo) & (kv_idx < hi)

        return create_block_mask(mask_mod, B, None, Sq, Skv, device=q.device)

    return mask.cached(("flex", causal, B, Sq, Skv, str(q.device)), make)


def pattern_block_mask(pattern, causal: bool, device):
    """A mask kind's layout (masks.Layout: packed documents, a sparse block layout, a prefix,
    a plugin's) as a block mask, its ``rule`` the mask_mod: (B, 1, S, S)."""

    def mask_mod(b, h, q_idx, kv_idx):
        return pattern.rule(b, q_idx, kv_idx, causal)

    S = pattern.seq_len
    return create_block_mask(mask_mod, pattern.batch, None, S, S, device=device)


def score_mod(q, k, mask):
    """The case's score modifier (masks.ScoreMod.scores) as FlexAttention's score_mod, at the
    query's position among the keys; None without one."""
    if mask is None or mask.score_mod is None:
        return None
    apply, shift = mask.score_mod.scores, mask.shift(q.shape[-2], k.shape[-2])

    def modded(score, b, h, q_idx, kv_idx):
        return apply(score, h, q_idx + shift, kv_idx)

    return modded


def work_pairs(case, mask) -> int:
    """(query, key) pairs in the tiles the block mask leaves in (partial and full tiles,
    masked entries included), per head, summed over the batch; the whole matrix without one."""
    q = torch.empty(case.batch, 1, case.seq_q, 0, device=case.device)
    k = torch.empty(case.batch, 1, case.seq_kv, 0, device=case.device)
    bm = block_mask(q, k, case.causal, mask)
    if bm is None:
        return case.batch * case.seq_q * case.seq_kv
    tiles = bm.to_dense().cpu()  # (Bm, 1, nq, nk): 1 where a tile is computed
    bq, bk = bm.BLOCK_SIZE
    rows = (torch.arange(tiles.shape[-2]) * bq).clamp(max=case.seq_q)
    rows = (rows + bq).clamp(max=case.seq_q) - rows  # tile heights, the last may be short
    cols = (torch.arange(tiles.shape[-1]) * bk).clamp(max=case.seq_kv)
    cols = (cols + bk).clamp(max=case.seq_kv) - cols
    per_row = int((tiles * (rows[:, None] * cols[None, :])).sum())
    return per_row * (case.batch // tiles.shape[0])


@register(
    "flex",
    color="#8c564b",
    masks=ANY,
    score_mods=ANY,
    causal_align=ALIGNS,
    compiled=True,
    backward=("cuda",),  # FlexAttention has no backward on the CPU
    work=work_pairs,
    description="torch.nn.attention.flex_attention, torch.compile'd, block masks",
)
def flex(q, k, v, *, causal, scale, mask):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D)
    try:
        return _flex(
            q,
            k,
            v,
            block_mask=block_mask(q, k, causal, mask),
            score_mod=score_mod(q, k, mask),
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
    except NotImplementedError as exc:  # FlexAttention refuses the case
        raise Unsupported(" ".join(str(exc).split())) from exc
