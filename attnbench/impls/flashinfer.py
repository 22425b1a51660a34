"""FlashInfer (flashinfer-python): ``flashinfer`` over a contiguous KV cache and
``flashinfer_paged`` over a paged one; CUDA only, forward only (FlashInfer has no autograd), in
its NHD layout: (S, H, D) per request, attnbench's (B, S, H, D) per batch row.

``flashinfer``:

- batch 1: ``single_decode_with_kv_cache`` for one new token (q (Hq, D)), else
  ``single_prefill_with_kv_cache`` (q (Sq, Hq, D); k, v (Skv, Hkv, D));
- batch > 1, or packed documents: ``BatchPrefillWithRaggedKVCacheWrapper`` over the batch
  flattened into (B * S, H, D), one request per batch row (or per document: ``qo_indptr`` =
  ``kv_indptr`` = the documents' cu_seqlens); one new token per row:
  ``BatchDecodeWithPagedKVCacheWrapper`` over the contiguous cache viewed, without a copy, as
  one page of Skv tokens per sequence.

``flashinfer_paged``: the harness's pools and block table (run/measuring/inputs.py ``paged``) as
FlashInfer's own page table: ``kv_indptr`` = (0, P, 2P, ...), ``kv_indices`` = the block table
row by row, ``kv_last_page_len`` = Skv - (P - 1) * page; ``BatchDecodeWithPagedKVCacheWrapper``
for one new token per sequence, ``BatchPrefillWithPagedKVCacheWrapper`` for more.

A wrapper is planned once per row, outside the timing (its ``plan`` reads the lengths on the
host), with a 128 MiB workspace, as a server plans once per batch for all its layers.

Conventions (FlashInfer's docstrings): causal is aligned bottom-right (query i at
p = i + kv_len - qo_len); ``window_left`` keeps keys j >= p - window_left, so attnbench's causal
window W is window_left = W - 1; FlashInfer has no window to the right, so a window without
causal is unsupported. Head dims 64, 128 and 256: those FlashInfer builds its kernels for.
"""

from __future__ import annotations

import torch

from attnbench.case import Case
from attnbench.registry import register

INSTALL = "pip install 'flashinfer-python>=0.2'"
WORKSPACE_BYTES = 128 * 2**20
HEAD_DIMS = (64, 128, 256)


def window_left(window: int | None) -> int:
    """attnbench's causal window W as FlashInfer's inclusive left window; -1: none."""
    return -1 if window is None else window - 1


def reasons(case: Case) -> list[str]:
    """What FlashInfer's calling convention cannot express for a case."""
    out = []
    if case.mask == "window" and not case.causal:
        out.append("mask=window with causal=False (supported: causal; FlashInfer's window is left)")
    aligned = case.causal or case.mask == "window"
    if aligned and case.seq_q > case.seq_kv:
        out.append(
            f"seq_q={case.seq_q} > seq_kv={case.seq_kv} with causal (supported: seq_q <= seq_kv)"
        )
    return out


def _workspace(mask, device) -> torch.Tensor:
    return mask.cached(
        ("flashinfer", "workspace", str(device)),
        lambda: torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device),
    )


def _indptr(lengths: list[int], device) -> torch.Tensor:
    """(0, l0, l0 + l1, ...) int32."""
    return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)


def _ragged(fi, q, k, causal, scale, mask, qo_lens, kv_lens):
    """A BatchPrefillWithRaggedKVCacheWrapper planned for requests of these lengths."""
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(mask, q.device), "NHD")
    wrapper.plan(
        _indptr(qo_lens, q.device),
        _indptr(kv_lens, q.device),
        q.shape[2],
        k.shape[2],
        q.shape[3],
        causal=causal,
        sm_scale=scale,
        window_left=window_left(mask.window),
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    return wrapper


def _decode(fi, q, k, scale, mask, table, last_page_len, page_tokens):
    """A BatchDecodeWithPagedKVCacheWrapper planned for one new token per sequence over the
    page table ``table`` (B, P) int32 whose pages hold ``page_tokens``."""
    B, P = table.shape
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(mask, q.device), "NHD")
    wrapper.plan(
        _indptr([P] * B, q.device),
        table.reshape(-1).contiguous(),
        torch.full((B,), last_page_len, dtype=torch.int32, device=q.device),
        q.shape[2],
        k.shape[2],
        q.shape[3],
        page_tokens,
        window_left=window_left(mask.window),
        sm_scale=scale,
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    return wrapper


@register(
    "flashinfer",
    color="#17a589",
    devices=("cuda",),
    dtypes=("bfloat16", "float16"),
    head_dims=HEAD_DIMS,
    layout="bshd",
    masks=("window", "document"),
    causal_align=("bottom_right",),
    backward=False,
    sm=(80, None),
    check=reasons,
    requires={"flashinfer": INSTALL},
    description="FlashInfer: single/batch prefill and decode over a contiguous KV cache",
)
def flashinfer(q, k, v, *, causal, scale, mask):
    import flashinfer as fi

    # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D) -> (B, Sq, Hq, D)
    B, Sq, Hq, D = q.shape
    Skv = k.shape[1]
    left = window_left(mask.window)
    if mask.pattern is None and B == 1 and Sq == 1:
        return fi.single_decode_with_kv_cache(
            q[0, 0], k[0], v[0], kv_layout="NHD", sm_scale=scale, window_left=left
        ).view(1, 1, Hq, D)
    if mask.pattern is None and B == 1:
        out = fi.single_prefill_with_kv_cache(
            q[0], k[0], v[0], causal=causal, kv_layout="NHD", sm_scale=scale, window_left=left
        )
        return out.view(1, Sq, Hq, D)
    if mask.pattern is None and Sq == 1:  # one page of Skv tokens per sequence, no copy
        wrapper = mask.cached(
            ("flashinfer", "decode", B, Skv, str(q.device)),
            lambda: _decode(
                fi,
                q,
                k,
                scale,
                mask,
                torch.arange(B, dtype=torch.int32, device=q.device)[:, None],
                Skv,
                Skv,
            ),
        )
        return wrapper.run(q.view(B, Hq, D), (k, v)).view(B, 1, Hq, D)
    if mask.pattern is not None:  # one request per document
        lens = [n for row in mask.pattern.doc_lens for n in row]
        qo_lens, kv_lens = lens, lens
    else:
        qo_lens, kv_lens = [Sq] * B, [Skv] * B
    wrapper = mask.cached(
        ("flashinfer", "ragged", causal, B, Sq, Skv, str(q.device)),
        lambda: _ragged(fi, q, k, causal, scale, mask, qo_lens, kv_lens),
    )
    flat = [t.reshape(B * t.shape[1], *t.shape[2:]) for t in (q, k, v)]  # views
    return wrapper.run(*flat).view(B, Sq, Hq, D)


def _paged_prefill(fi, q, k, causal, scale, mask, table, last_page_len):
    """A BatchPrefillWithPagedKVCacheWrapper planned for Sq new tokens per sequence."""
    B, P = table.shape
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(_workspace(mask, q.device), "NHD")
    wrapper.plan(
        _indptr([q.shape[1]] * B, q.device),
        _indptr([P] * B, q.device),
        table.reshape(-1).contiguous(),
        torch.full((B,), last_page_len, dtype=torch.int32, device=q.device),
        q.shape[2],
        k.shape[2],
        q.shape[3],
        k.shape[1],
        causal=causal,
        sm_scale=scale,
        window_left=window_left(mask.window),
        q_data_type=q.dtype,
        kv_data_type=k.dtype,
    )
    return wrapper


@register(
    "flashinfer_paged",
    color="#76d7c4",
    devices=("cuda",),
    dtypes=("bfloat16", "float16"),
    head_dims=HEAD_DIMS,
    layout="bshd",
    masks=("window",),
    causal_align=("bottom_right",),
    paged=True,
    backward=False,
    sm=(80, None),
    check=reasons,
    requires={"flashinfer": INSTALL},
    description="FlashInfer: batch decode / prefill over a paged KV cache, its own page table",
)
def flashinfer_paged(q, k, v, *, causal, scale, mask, block_table, seq_kv):
    import flashinfer as fi

    # q (B, Sq, Hq, D); k, v pools (pages, page_tokens, Hkv, D); block_table (B, P) int32
    B, Sq, Hq, D = q.shape
    page = k.shape[1]
    last = seq_kv - (block_table.shape[1] - 1) * page  # tokens in each sequence's last page
    if Sq == 1:
        wrapper = mask.cached(
            ("flashinfer_paged", "decode", B, seq_kv, str(q.device)),
            lambda: _decode(fi, q, k, scale, mask, block_table, last, page),
        )
        return wrapper.run(q.view(B, Hq, D), (k, v)).view(B, 1, Hq, D)
    wrapper = mask.cached(
        ("flashinfer_paged", "prefill", causal, B, Sq, seq_kv, str(q.device)),
        lambda: _paged_prefill(fi, q, k, causal, scale, mask, block_table, last),
    )
    return wrapper.run(q.reshape(B * Sq, Hq, D), (k, v)).view(B, Sq, Hq, D)
