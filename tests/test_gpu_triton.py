"""``triton_flash`` on a GPU at its hard cases, so that a lease's first minutes tell whether the
kernel is right on hardware: head dims 40, 80, 96 and 256 (padded tiles), bottom-right causal,
one query row (Sq = 1, decoding), GQA, Sq > Skv, and packed sequences of different lengths.

Dense cases go through the harness itself (registry, autotuning, ``testing.run_row`` and its
agreement rule against the float64 reference); packed sequences call the kernel's varlen
entry and compare each sequence with its own float64 reference. All are marked ``gpu``
(skipped without CUDA) and match ``-k triton`` (scripts/gpu_check.sh's tests-triton stage).
Their CPU-interpreter counterparts, on tiny shapes, are in test_triton_hopper.py."""

import math

import pytest
import torch

from attnbench.case import Case
from attnbench.masks import Mask
from attnbench.measure.agreement import rule
from attnbench.measure.reference import magnitude, reference
from attnbench.measure.timing import TimerConfig
from attnbench.run.measuring.row import Settings
from attnbench.testing import run_row

pytestmark = pytest.mark.gpu

# (heads, kv_heads, seq_q, seq_kv, head_dim, dtype, causal, align, mode)
CASES = [
    (8, 2, 77, 131, 40, "bfloat16", True, "bottom_right", "fwd_bwd"),  # GQA, ragged, D40
    (8, 8, 1, 4099, 80, "bfloat16", True, "bottom_right", "fwd"),  # decode: Sq = 1, D80
    (4, 1, 1, 1000, 128, "float16", True, "bottom_right", "fwd"),  # MQA decode, fp16
    (8, 4, 1031, 517, 96, "float16", False, "top_left", "fwd_bwd"),  # Sq > Skv, D96
    (4, 4, 300, 200, 96, "bfloat16", True, "bottom_right", "fwd_bwd"),  # rows that see no key
    (4, 2, 1024, 1024, 256, "bfloat16", True, "top_left", "fwd_bwd"),  # the largest head dim
    (4, 4, 513, 2048, 256, "bfloat16", True, "bottom_right", "fwd_bwd"),
]


@pytest.mark.parametrize(
    "Hq,Hkv,Sq,Skv,D,dtype,causal,align,mode",
    CASES,
    ids=[f"triton_H{c[0]}-{c[1]}_S{c[2]}x{c[3]}_D{c[4]}_{c[5]}_{c[7]}_{c[8]}" for c in CASES],
)
def test_triton_flash_hard_cases_agree_on_the_gpu(
    impls, Hq, Hkv, Sq, Skv, D, dtype, causal, align, mode
):
    impl = impls["triton_flash"]
    if not impl.available:
        pytest.skip(impl.unavailable)
    case = Case(
        batch=2, heads=Hq, kv_heads=Hkv, seq_q=Sq, seq_kv=Skv, head_dim=D, dtype=dtype,
        causal=causal, causal_align=align, mode=mode, device="cuda",
    )  # fmt: skip
    assert impl.reasons(case) == []
    row = run_row(impl, case, settings=Settings(TimerConfig(rep_ms=5)))
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]


@pytest.mark.parametrize("causal,align", [(True, "bottom_right"), (True, "top_left"), (False, "")])
def test_triton_flash_packed_sequences_agree_on_the_gpu(causal, align):
    pytest.importorskip("triton")
    from attnbench.impls.triton_flash.kernel import flash_attention_varlen

    # Sq < Skv, Sq > Skv, Sq = 1, equal, and one longer than a tile
    lens_q, lens_k = [5, 300, 1, 128, 1000], [90, 170, 777, 128, 1200]
    D, Hq, Hkv, dtype = 128, 8, 2, torch.bfloat16
    scale = 1 / math.sqrt(D)
    g = torch.Generator(device="cuda").manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    seqs = [(randn(1, Hq, a, D), randn(1, Hkv, b, D), randn(1, Hkv, b, D)) for a, b in
            zip(lens_q, lens_k)]  # fmt: skip
    dos = [randn(1, Hq, a, D) for a in lens_q]

    def pack(ts):  # [(1, H, S_b, D)] -> (sum S_b, H, D)
        return torch.cat([t[0].transpose(0, 1) for t in ts])

    q, k, v = (pack([s[i] for s in seqs]).requires_grad_() for i in range(3))
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], device="cuda")
    out = flash_attention_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, scale=scale,
        causal_align=align or "top_left",
    )  # fmt: skip
    got = dict(
        zip(("out", "dq", "dk", "dv"), (out, *torch.autograd.grad(out, (q, k, v), pack(dos))))
    )
    bad = []
    for b, ((qb, kb, vb), dob) in enumerate(zip(seqs, dos)):
        args = dict(causal=causal, scale=scale, dout=dob, mask=Mask(align=align or "top_left"))
        ref_out, ref_grads = reference(qb, kb, vb, **args)
        mags = magnitude(qb, kb, vb, **args)
        rows = {"out": cu_q, "dq": cu_q, "dk": cu_k, "dv": cu_k}
        names = list(rows)
        mine = [got[n][rows[n][b] : rows[n][b + 1]].transpose(0, 1)[None] for n in names]
        verdict = rule(names, mine, [ref_out, *ref_grads], mags, dtype)  # (1, H, S_b, D) each
        bad += [] if verdict.agrees else [f"seq {b}: {'; '.join(verdict.notes)}"]
    assert not bad, "; ".join(bad)


def test_a_dense_forward_launches_its_kernel_alone():
    """One dense forward call is one kernel on the GPU: nothing launched beside it (a fill
    kernel for the unused cumulative lengths ran before every call until the first H100
    lease's profiler showed it)."""
    from attnbench.impls.triton_flash.kernel import flash_attention
    from attnbench.measure.profiling import profile_fn

    q, k, v = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    prof = profile_fn(lambda: flash_attention(q, k, v, causal=True, scale=0.125), "cuda")
    names = [kernel["kernel"] for kernel in prof.kernels]
    assert names == ["fwd_kernel"], names
