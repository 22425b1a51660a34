"""Stand-ins for flash-attn (FA2 and FA3) and FlashInfer on the CPU: their calling conventions
(argument names, layouts, bottom-right causal alignment, inclusive windows, cu_seqlens, page
tables) in plain torch, written from the libraries' docstrings and independently of attnbench's
impls, so that a wrong argument mapping disagrees with the float64 reference.

``fake_flash_attn(3)`` is FA3's flash_attn_interface (page_table; flash_attn_func returning
(out, lse) as its older versions do). Each fake also records the functions called, in ``calls``.
"""

from __future__ import annotations

import types

import torch


def attend(q, k, v, scale, causal=False, left=-1, right=-1):
    """One request: q (Sq, Hq, D), k, v (Skv, Hkv, D) -> (Sq, Hq, D). Query i sits at
    p = i + Skv - Sq; keys p - left <= j <= p + right (-1: unbounded), j <= p when causal; a
    query without keys outputs zeros."""
    Sq, Hq, _ = q.shape
    Skv, Hkv, _ = k.shape
    group = Hq // Hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    p = torch.arange(Sq)[:, None] + Skv - Sq
    j = torch.arange(Skv)[None, :]
    keep = torch.ones(Sq, Skv, dtype=torch.bool)
    if causal:
        keep &= j <= p
    if left >= 0:
        keep &= j >= p - left
    if right >= 0 and not causal:
        keep &= j <= p + right
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    s = s.masked_fill(~keep, torch.finfo(torch.float32).min).softmax(-1)
    s = s * keep.any(-1)[None, :, None]  # rows without keys: zeros
    return torch.einsum("hqk,khd->qhd", s, v.float()).to(q.dtype)


def _scale(q, softmax_scale):
    return q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale


def fake_flash_attn(version: int = 2) -> types.ModuleType:
    mod = types.ModuleType("flash_attn" if version == 2 else "flash_attn_interface")
    mod.calls = []

    def flash_attn_func(
        q, k, v, *args, softmax_scale=None, causal=False, window_size=(-1, -1), **kw
    ):
        # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D)
        assert not args, "pass options by name"
        mod.calls.append("flash_attn_func")
        left, right = window_size
        out = torch.stack(
            [
                attend(q[b], k[b], v[b], _scale(q, softmax_scale), causal, left, right)
                for b in range(q.shape[0])
            ]
        )
        return (out, None) if version == 3 else out

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        *args,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        **kw,
    ):
        # q (total_q, Hq, D); k, v (total_k, Hkv, D); cu_seqlens (n + 1,) int32
        assert not args, "pass options by name"
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
        mod.calls.append("flash_attn_varlen_func")
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert max_seqlen_q >= max(b - a for a, b in zip(cq, cq[1:]))
        assert max_seqlen_k >= max(b - a for a, b in zip(ck, ck[1:]))
        left, right = window_size
        outs = [
            attend(q[a:b], k[c:d], v[c:d], _scale(q, softmax_scale), causal, left, right)
            for a, b, c, d in zip(cq, cq[1:], ck, ck[1:])
        ]
        return torch.cat(outs)

    def flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        *args,
        cache_seqlens=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        **kw,
    ):
        # q (B, Sq, Hq, D); k_cache (B, S, Hkv, D), or pages (n, page, Hkv, D) with a table
        assert not args and k is None and v is None
        mod.calls.append("flash_attn_with_kvcache")
        table = kw.pop("block_table" if version == 2 else "page_table", None)
        assert not {"block_table", "page_table"} & set(kw), f"unknown table argument in {kw}"
        B = q.shape[0]
        if table is not None:
            assert table.dtype == torch.int32 and table.shape[0] == B
            page = k_cache.shape[1]
            if version == 2:
                assert page % 256 == 0, "Paged KV cache block size must be divisible by 256"
            k_cache, v_cache = (
                c[table.long()].reshape(B, -1, *c.shape[2:]) for c in (k_cache, v_cache)
            )
        lens = [k_cache.shape[1]] * B
        if cache_seqlens is not None:
            lens = [cache_seqlens] * B if isinstance(cache_seqlens, int) else cache_seqlens.tolist()
        left, right = window_size
        with torch.no_grad():  # no backward, as the library's
            out = [
                attend(
                    q[b],
                    k_cache[b, :n],
                    v_cache[b, :n],
                    _scale(q, softmax_scale),
                    causal,
                    left,
                    right,
                )
                for b, n in zip(range(B), lens)
            ]
        return torch.stack(out)

    mod.flash_attn_func = flash_attn_func
    mod.flash_attn_varlen_func = flash_attn_varlen_func
    mod.flash_attn_with_kvcache = flash_attn_with_kvcache
    return mod


def fake_flashinfer() -> types.ModuleType:
    mod = types.ModuleType("flashinfer")
    mod.calls = []

    def single_prefill_with_kv_cache(
        q, k, v, *args, causal=False, kv_layout="NHD", sm_scale=None, window_left=-1, **kw
    ):
        # q (Sq, Hq, D); k, v (Skv, Hkv, D)
        assert not args and kv_layout == "NHD"
        mod.calls.append("single_prefill_with_kv_cache")
        return attend(q, k, v, _scale(q, sm_scale), causal, window_left)

    def single_decode_with_kv_cache(
        q, k, v, *args, kv_layout="NHD", sm_scale=None, window_left=-1, **kw
    ):
        # q (Hq, D); k, v (Skv, Hkv, D)
        assert not args and kv_layout == "NHD" and q.dim() == 2
        mod.calls.append("single_decode_with_kv_cache")
        return attend(q[None], k, v, _scale(q, sm_scale), True, window_left)[0]

    class _Wrapper:
        def __init__(self, workspace, kv_layout="NHD", **kw):
            assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
            self.plan_args = None

        def _options(self, causal, sm_scale, window_left, q_data_type, kv_data_type):
            assert q_data_type is not None and kv_data_type is not None
            self.causal, self.sm_scale, self.left = causal, sm_scale, window_left

        def _kv(self, paged_kv_cache, b):
            return [self._pages(cache, b) for cache in paged_kv_cache]

        def _pages(self, cache, b):
            """Request b's keys or values from its pages, the last one cut."""
            pages = self.indices[self.kv_indptr[b] : self.kv_indptr[b + 1]]
            rows = cache[torch.tensor(pages, dtype=torch.long)].reshape(-1, *cache.shape[2:])
            return rows[: (len(pages) - 1) * cache.shape[1] + self.last[b]]

    class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
        def plan(
            self,
            qo_indptr,
            kv_indptr,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            *args,
            causal=False,
            sm_scale=None,
            window_left=-1,
            q_data_type=None,
            kv_data_type=None,
            **kw,
        ):
            assert not args and qo_indptr.dtype == kv_indptr.dtype == torch.int32
            mod.calls.append("BatchPrefillWithRaggedKVCacheWrapper.plan")
            self.qo, self.kv = qo_indptr.tolist(), kv_indptr.tolist()  # read on the host
            self.heads = (num_qo_heads, num_kv_heads, head_dim_qk)
            self._options(causal, sm_scale, window_left, q_data_type, kv_data_type)

        def run(self, q, k, v):
            # q (total_q, Hq, D); k, v (total_k, Hkv, D)
            assert (q.shape[1], k.shape[1], q.shape[2]) == self.heads
            mod.calls.append("BatchPrefillWithRaggedKVCacheWrapper.run")
            scale = _scale(q, self.sm_scale)
            return torch.cat(
                [
                    attend(q[a:b], k[c:d], v[c:d], scale, self.causal, self.left)
                    for a, b, c, d in zip(self.qo, self.qo[1:], self.kv, self.kv[1:])
                ]
            )

    class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
        def plan(
            self,
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            *args,
            window_left=-1,
            sm_scale=None,
            q_data_type=None,
            kv_data_type=None,
            **kw,
        ):
            assert not args
            assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
            mod.calls.append("BatchDecodeWithPagedKVCacheWrapper.plan")
            self.kv_indptr, self.indices = indptr.tolist(), indices.tolist()
            self.last, self.page = last_page_len.tolist(), page_size
            self.heads = (num_qo_heads, num_kv_heads, head_dim)
            self._options(True, sm_scale, window_left, q_data_type, kv_data_type)

        def run(self, q, paged_kv_cache):
            # q (B, Hq, D); pages (n, page, Hkv, D)
            k_cache, v_cache = paged_kv_cache
            assert k_cache.shape[1] == self.page
            assert (q.shape[1], k_cache.shape[2], q.shape[2]) == self.heads
            mod.calls.append("BatchDecodeWithPagedKVCacheWrapper.run")
            scale = _scale(q, self.sm_scale)
            return torch.stack(
                [
                    attend(
                        q[b][None],
                        self._pages(k_cache, b),
                        self._pages(v_cache, b),
                        scale,
                        True,
                        self.left,
                    )[0]
                    for b in range(q.shape[0])
                ]
            )

    class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
        def plan(
            self,
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            page_size,
            *args,
            causal=False,
            sm_scale=None,
            window_left=-1,
            q_data_type=None,
            kv_data_type=None,
            **kw,
        ):
            assert not args and paged_kv_indices.dtype == torch.int32
            mod.calls.append("BatchPrefillWithPagedKVCacheWrapper.plan")
            self.qo = qo_indptr.tolist()
            self.kv_indptr, self.indices = paged_kv_indptr.tolist(), paged_kv_indices.tolist()
            self.last, self.page = paged_kv_last_page_len.tolist(), page_size
            self.heads = (num_qo_heads, num_kv_heads, head_dim_qk)
            self._options(causal, sm_scale, window_left, q_data_type, kv_data_type)

        def run(self, q, paged_kv_cache):
            # q (total_q, Hq, D); pages (n, page, Hkv, D)
            k_cache, v_cache = paged_kv_cache
            assert k_cache.shape[1] == self.page
            mod.calls.append("BatchPrefillWithPagedKVCacheWrapper.run")
            scale = _scale(q, self.sm_scale)
            return torch.cat(
                [
                    attend(q[a:b], *self._kv(paged_kv_cache, r), scale, self.causal, self.left)
                    for r, (a, b) in enumerate(zip(self.qo, self.qo[1:]))
                ]
            )

    mod.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    mod.single_decode_with_kv_cache = single_decode_with_kv_cache
    mod.BatchPrefillWithRaggedKVCacheWrapper = BatchPrefillWithRaggedKVCacheWrapper
    mod.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    mod.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    return mod
