"""FlashAttention-2 (``flash_attn2``: the flash-attn package, module ``flash_attn``) and
FlashAttention-3 (``flash_attn3``: module ``flash_attn_interface``, built from flash-attention's
hopper/ folder), in their own (B, S, H, D) layout; CUDA only.

Which of the library's functions a row calls:

- mask document: ``flash_attn_varlen_func`` over the batch flattened into (B * S, H, D), with
  ``cu_seqlens`` (int32, ndocs + 1) of the drawn documents and the longest as ``max_seqlen``;
- a forward with seq_q < seq_kv (new tokens against a KV cache: decoding):
  ``flash_attn_with_kvcache``, the kernel servers call there (it splits the keys across
  blocks), with ``cache_seqlens`` = seq_kv;
- otherwise ``flash_attn_func`` (forward and backward);
- ``flash_attn2_paged`` / ``flash_attn3_paged``: ``flash_attn_with_kvcache`` reading the page
  pools through the block table (``block_table`` in FA2, whose pages must hold a multiple of
  256 tokens, so its cache is paged in 256-token pages; ``page_table`` in FA3, any page size,
  so it reads the harness's 128-token pages).

Conventions (the libraries' docstrings): causal is aligned bottom-right (flash-attn >= 2.1 and
FA3): query i sits at p = i + Skv - Sq, and a top-left diagonal across unequal lengths cannot be
asked for (unsupported). ``window_size=(left, right)`` keeps keys p - left <= j <= p + right:
attnbench's causal window W is (W - 1, 0), its window W (|p - j| < W) is (W - 1, W - 1). GQA is
native (kv head h // (Hq / Hkv)). The per-row tensors (cu_seqlens, cache_seqlens) are made once
per row, outside the timing, as a server keeps them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass

import torch

from attnbench.case import Case
from attnbench.registry import register

FA2_INSTALL = "pip install 'flash-attn>=2.1' --no-build-isolation"
# FlashAttention-3 is on no index: this builds it from the project's repository (needs nvcc)
FA3_INSTALL = (
    "pip install 'git+https://github.com/Dao-AILab/flash-attention#subdirectory=hopper' "
    "--no-build-isolation"
)
MAX_HEAD_DIM = 256
FA2_PAGE_TOKENS = 256  # flash-attn 2: "Paged KV cache block size must be divisible by 256"


@dataclass(frozen=True)
class Api:
    """What differs between the two libraries' calling conventions."""

    module: str  # the module holding flash_attn_func, flash_attn_varlen_func, ...
    table_arg: str  # flash_attn_with_kvcache's name for the page table


FA2 = Api("flash_attn", "block_table")
FA3 = Api("flash_attn_interface", "page_table")


def fa2_too_old() -> str | None:
    """flash-attn before 2.1 aligned the causal diagonal top-left."""
    try:
        version = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return None  # requires= says it is missing (or a build without metadata)
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if parts >= (2, 1):
        return None
    return (
        f"flash-attn {version} aligns the causal diagonal top-left; attnbench needs >= 2.1 "
        f"(install: {FA2_INSTALL})"
    )


def window_size(causal: bool, window: int | None) -> tuple[int, int]:
    """attnbench's window as flash-attn's inclusive (left, right) around p; (-1, -1): none."""
    if window is None:
        return (-1, -1)
    return (window - 1, 0 if causal else window - 1)


def reasons(case: Case) -> list[str]:
    """What flash-attn's calling convention cannot express for a case."""
    out = []
    if case.head_dim > MAX_HEAD_DIM or case.head_dim % 8:
        out.append(f"head_dim={case.head_dim} (supported: multiples of 8 up to {MAX_HEAD_DIM})")
    return out


def _out(result) -> torch.Tensor:
    """The output alone (some versions return (out, lse))."""
    return result[0] if isinstance(result, tuple) else result


def attend(api: Api, q, k, v, *, causal: bool, scale: float, mask):
    # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D) -> (B, Sq, Hq, D)
    fa = importlib.import_module(api.module)
    B, Sq, Hq, D = q.shape
    Skv = k.shape[1]
    common = dict(softmax_scale=scale, causal=causal, window_size=window_size(causal, mask.window))
    if mask.pattern is not None:  # packed documents: one sequence per document
        cu, longest = mask.cached(
            ("flash_attn", "cu_seqlens", str(q.device)),
            lambda: (
                mask.pattern.cu_seqlens(q.device),
                max(n for row in mask.pattern.doc_lens for n in row),
            ),
        )
        flat = [t.reshape(B * t.shape[1], *t.shape[2:]) for t in (q, k, v)]  # views
        out = fa.flash_attn_varlen_func(*flat, cu, cu, longest, longest, **common)
        return _out(out).view(B, Sq, Hq, D)
    if Sq < Skv and not q.requires_grad:  # new tokens against a KV cache
        seqlens = mask.cached(
            ("flash_attn", "cache_seqlens", B, Skv, str(q.device)),
            lambda: torch.full((B,), Skv, dtype=torch.int32, device=q.device),
        )
        return _out(fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **common))
    return _out(fa.flash_attn_func(q, k, v, **common))


def attend_paged(api: Api, q, k, v, *, causal, scale, mask, block_table, seq_kv):
    # q (B, Sq, Hq, D); k, v pools (pages, page_tokens, Hkv, D); block_table (B, P) int32
    fa = importlib.import_module(api.module)
    seqlens = mask.cached(
        ("flash_attn", "cache_seqlens", q.shape[0], seq_kv, str(q.device)),
        lambda: torch.full((q.shape[0],), seq_kv, dtype=torch.int32, device=q.device),
    )
    out = fa.flash_attn_with_kvcache(
        q,
        k,
        v,
        cache_seqlens=seqlens,
        softmax_scale=scale,
        causal=causal,
        window_size=window_size(causal, mask.window),
        **{api.table_arg: block_table},
    )
    return _out(out)


def _register():
    fa2 = dict(
        devices=("cuda",),
        dtypes=("bfloat16", "float16"),
        layout="bshd",
        causal_align=("bottom_right",),  # top-left runs where the two coincide (registry)
        check=reasons,
        sm=(80, None),
        requires={"flash_attn": FA2_INSTALL},
        unavailable=fa2_too_old(),
    )
    # FA3 runs on Hopper (sm_90), and on Ampere/Ada where its sm_80 kernels were built
    fa3 = {**fa2, "sm": (80, 90), "requires": {"flash_attn_interface": FA3_INSTALL}}
    fa3.pop("unavailable")
    for name, api, opts, color, what in (
        ("flash_attn2", FA2, fa2, "#e377c2", "FlashAttention-2 (flash-attn)"),
        ("flash_attn3", FA3, fa3, "#f7b6d2", "FlashAttention-3 (flash_attn_interface)"),
    ):
        register(
            name,
            color=color,
            masks=("window", "document"),
            description=f"{what}: flash_attn_func, varlen for documents, with_kvcache to decode",
            **opts,
        )(_bind(attend, api))
        register(
            f"{name}_paged",
            masks=("window",),
            paged=True,
            page_tokens=FA2_PAGE_TOKENS if api is FA2 else None,
            backward=False,
            description=f"{what}: flash_attn_with_kvcache over a paged KV cache",
            **opts,
        )(_bind(attend_paged, api))


def _bind(fn, api: Api):
    """``fn`` with the library's calling convention filled in, as an impl function."""

    def impl(q, k, v, **kwargs):
        return fn(api, q, k, v, **kwargs)

    impl.__doc__ = fn.__doc__
    return impl


_register()
