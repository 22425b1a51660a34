"""Tile configs of ``triton_flash`` per GPU architecture, autotuning, and launching.

The lists are short on purpose: they were chosen from compiling candidates offline for
sm90 (``compile_report.py``; ``benchmarks/triton_flash_compile_report.md`` holds its output
for every kept config under Triton 3.6 and 3.9, spills included where no candidate was
free of them). They are keyed by the
padded head dim ``HEAD_PAD`` (the power of two the tiles are built for), since register and
shared-memory use grow with it. On sm90 every matmul has M >= 64 (wgmma's tile height).

Under ``TRITON_INTERPRET=1`` (the CPU interpreter) nothing is tuned: ``INTERPRET_TILES`` or
the caller's ``tiles=`` are used, and the persistent forward grid is 3 programs so the
per-program tile loop is exercised.
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton

from attnbench.impls.triton_flash.bwd import bwd_kernel
from attnbench.impls.triton_flash.fwd import fwd_kernel

# (BLOCK_M, BLOCK_N) when interpreting or when a caller passes tiles= (no autotune)
INTERPRET_TILES = (32, 16)
INTERPRET_PROGRAMS = 3

# fwd: (BLOCK_M, BLOCK_N, warps, stages, PIPELINE); bwd: (BLOCK_M, BLOCK_N, warps, stages)
CONFIGS = {
    90: {
        "fwd": {
            16: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            32: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            64: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            128: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            256: [(64, 64, 8, 2, False), (128, 32, 8, 2, False)],
        },
        "bwd": {  # 128 and 256: the least spilling found (see the report), no clean one
            16: [(64, 64, 8, 2)],
            32: [(64, 64, 8, 2)],
            64: [(64, 64, 8, 2)],
            128: [(64, 64, 8, 2)],
            256: [(64, 64, 8, 1)],
        },
    },
    80: {
        "fwd": {
            16: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            32: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            64: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            128: [(128, 64, 8, 3, False), (64, 64, 4, 3, False)],
            256: [(64, 64, 8, 2, False), (64, 32, 4, 2, False)],
        },
        "bwd": {
            16: [(64, 64, 4, 2), (32, 64, 4, 2)],
            32: [(64, 64, 4, 2), (32, 64, 4, 2)],
            64: [(64, 64, 4, 2), (32, 64, 4, 2)],
            128: [(64, 64, 8, 2), (32, 64, 4, 2)],
            256: [(32, 64, 8, 1), (32, 32, 4, 1)],
        },
    },
}


def interpreting() -> bool:
    """True when the kernels were built for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(fwd_kernel, triton.runtime.jit.JITFunction)


def arch() -> int:
    """The config family for the current GPU: 90 on Hopper and newer, else 80."""
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 8
    return 90 if major >= 9 else 80


def _triton_config(kind: str, cfg: tuple) -> triton.Config:
    kwargs = {"BLOCK_M": cfg[0], "BLOCK_N": cfg[1]}
    if kind == "fwd":
        kwargs["PIPELINE"] = cfg[4]
    return triton.Config(kwargs, num_warps=cfg[2], num_stages=cfg[3])


def _keep_for_head_pad(kind: str, family: int):
    """Autotune pruning: the configs listed for this HEAD_PAD only."""

    def prune(configs, named_args, **kwargs):
        listed = CONFIGS[family][kind][{**named_args, **kwargs}["HEAD_PAD"]]
        return [c for c in configs if config_tuple(kind, c) in listed]

    return prune


def config_tuple(kind: str, c: triton.Config) -> tuple:
    t = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
    return t + (c.kwargs["PIPELINE"],) if kind == "fwd" else t


_KERNELS = {"fwd": fwd_kernel, "bwd": bwd_kernel}
_KEY = ["SQ_KEY", "SKV_KEY", "HEAD_DIM", "HEAD_PAD", "CAUSAL", "ALIGN_END", "VARLEN"]

# tuning results kept on disk (Triton's cache) so that a new process does not benchmark
# every config again (triton >= 3.2 has cache_results)
_CACHE = (
    {"cache_results": True}
    if "cache_results" in inspect.signature(triton.autotune).parameters
    else {}
)


@functools.cache
def _tuned(kind: str, family: int):
    union = dict.fromkeys(cfg for per_pad in CONFIGS[family][kind].values() for cfg in per_pad)
    return triton.autotune(
        configs=[_triton_config(kind, c) for c in union],
        key=_KEY,  # + the argument dtypes, which triton adds itself
        prune_configs_by={"early_config_prune": _keep_for_head_pad(kind, family)},
        reset_to_zero=["DQ"] if kind == "bwd" else None,  # dq is accumulated by atomics
        **_CACHE,
    )(_KERNELS[kind])


def _alloc(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _ensure_allocator() -> None:
    """Descriptors built inside a kernel need a little global scratch memory; Triton asks
    the allocator set with ``triton.set_allocator`` (per thread), so set one when none is."""
    try:
        from triton.runtime import _allocation

        missing = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # a triton without the private module: set it
        missing = True
    if missing:
        triton.set_allocator(_alloc)


def launch(kind: str, grid_fn, args: tuple, consts: dict, tiles=None) -> None:
    """Run a kernel: autotuned on a GPU, with fixed tiles when interpreting or when given.
    ``tiles``: (BLOCK_M, BLOCK_N) or, for the forward, (BLOCK_M, BLOCK_N, PIPELINE)."""
    if not interpreting():
        _ensure_allocator()
        if tiles is None:
            _tuned(kind, arch())[grid_fn](*args, **consts)
            return
    tiles = tiles or INTERPRET_TILES
    meta = {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1]}
    if kind == "fwd":
        meta["PIPELINE"] = bool(tiles[2]) if len(tiles) > 2 else True
    _KERNELS[kind][grid_fn(meta)](*args, **consts, **meta)


def programs(tiles: int, meta: dict) -> int:
    """Persistent grid size: about one program per SM slot, never more than the tiles."""
    if interpreting() or not torch.cuda.is_available():
        return max(1, min(tiles, INTERPRET_PROGRAMS))
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    per_sm = 2 if meta.get("BLOCK_M", 128) * meta.get("BLOCK_N", 128) <= 64 * 64 else 1
    return max(1, min(tiles, sms * per_sm))
