"""Mask block_sparse (BigBird): keys and queries in blocks of ``block``; query block a keeps key
block c if |a - c| <= (local - 1) / 2 (a window of ``local`` blocks), if a or c is one of the
first ``global`` blocks (global tokens: they see and are seen by every block), or if c is one
of the ``random`` blocks drawn for a (from the seed, stream "sparse", among the blocks not
kept otherwise)."""

from __future__ import annotations

from attnbench.masks.blocks import BlockKind, BlockLayout, sparsity_params
from attnbench.masks.kind import register_kind
from attnbench.seeds import generator


def random_blocks(nblocks: int, local: int, n_global: int, n_random: int, seed: int):
    """Per query block, ``n_random`` key blocks drawn among those neither in its window nor
    global (fewer when fewer are left): (nblocks, n_random) int64, -1 where none."""
    import torch

    gen = generator("sparse", seed)
    out = torch.full((nblocks, n_random), -1, dtype=torch.int64)
    half = (local - 1) // 2
    for a in range(nblocks):
        free = [c for c in range(n_global, nblocks) if abs(a - c) > half]
        if a < n_global or not free or not n_random:
            continue  # a global block already sees every block
        pick = torch.randperm(len(free), generator=gen)[:n_random]
        out[a, : len(pick)] = torch.tensor(free)[pick]
    return out


class BigBird(BlockLayout):
    kind = "block_sparse"

    def __init__(self, seq_len, batch, block, local, n_global, random):
        import torch

        super().__init__(seq_len, batch, block)
        self.local, self.n_global = local, min(n_global, self.nblocks)
        self.random = torch.as_tensor(random, dtype=torch.int64)  # (nblocks, r), -1 none

    def draws(self) -> dict:
        return {"random_blocks": self.random.tolist()}

    def blocks(self, a, c):
        import torch

        keep = ((a - c).abs() <= (self.local - 1) // 2) | (a < self.n_global)
        keep = keep | (c < self.n_global)
        rows, picks = torch.nonzero(self.random >= 0, as_tuple=True)
        keep[rows, self.random[rows, picks]] = True
        return keep

    def hidden(self, i, j, causal):
        qb, kb = i // self.block, j // self.block  # (c, 1), (1, Skv)
        kept = (qb - kb).abs() <= (self.local - 1) // 2
        kept |= (qb < self.n_global) | (kb < self.n_global)
        drawn = self.random.to(i.device)[qb[:, 0]]  # (c, r): key blocks drawn for each query
        kept |= (drawn[:, None, :] == kb[..., None]).any(-1)  # (c, Skv)
        return (~kept | (j > i))[None] if causal else ~kept[None]


class BlockSparse(BlockKind):
    name = "block_sparse"
    meaning = "BigBird's block-sparse pattern (--sparsity)"
    short = "bsp"
    defaults = {"block": 64, "local": 3, "global": 1, "random": 2}

    def check_params(self, params):
        if params["local"] % 2 == 0:
            raise ValueError(
                f"local={params['local']} must be odd (a window of blocks centred on the query's)"
            )

    def layout(self, case, seed):
        p = sparsity_params(case.pattern)
        nblocks = -(-case.seq_q // p["block"])
        n_global = min(p["global"], nblocks)
        random = random_blocks(nblocks, p["local"], n_global, p["random"], seed)
        return self.from_draws(case, {"random_blocks": random})

    def from_draws(self, case, record):
        p = sparsity_params(case.pattern)
        return BigBird(
            case.seq_q,
            case.batch,
            p["block"],
            p["local"],
            p["global"],
            record["random_blocks"],
        )


register_kind(BlockSparse())
