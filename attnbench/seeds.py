"""The seed streams: every drawn quantity of a case comes from the run's ``--seed`` plus an
offset of its own, on the CPU, so that adding or changing one draw never moves another (the
q, k, v of a case stay the same whatever its mask). One table, distinct offsets (a test keeps
them so); docs/method.md ("Drawn data") lists them and the run's draws file stores what they
gave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


STREAMS: dict[str, int] = {
    "qkv": 0,  # q, k, v, dout (level layer: x, the projection weights, dout)
    "padding": 7919,  # mask padding: the valid key length of each batch row
    "documents": 104729,  # mask document: the lengths of the packed documents
    "sparse": 15485863,  # mask block_sparse: the random key blocks of each query block
    "pages": 32452843,  # paged KV caches: the order of the pages in the pool
    "layer_parts": 49979687,  # level layer: a module's biases and q/k norm weights
}


def generator(stream: str, seed: int) -> torch.Generator:
    """A CPU generator for ``stream`` of the run's ``seed``."""
    import torch

    return torch.Generator().manual_seed(seed + STREAMS[stream])
