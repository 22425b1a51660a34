"""The first Triton FlashAttention-2 kernel (``triton_flash_fa2``), run by Triton's CPU
interpreter against the float64 reference.

TRITON_INTERPRET must be set before triton is first imported (triton decorates its own helper
kernels at import time) and stay set while kernels run. So this module sets it at the top when
triton is not imported yet and runs the kernel tests in this process. When triton was already
imported without it (another test module came first), or a GPU is visible (an interpreted triton
in this process would turn later GPU tests into interpreter runs), it instead runs this file in
a subprocess with TRITON_INTERPRET=1 (``test_interpreted_in_subprocess``) and skips the
in-process copies.

Agreement is the harness's rule (docs/method.md, ``attnbench.measure.agreement.agrees``): errors
against the float64 reference within the bounds the float64 magnitude gives.

bfloat16: the interpreter (triton 3.9) computes ``tl.dot`` on bfloat16 by multiplying the raw
uint16 bit patterns, so bf16 results are garbage there; ``test_bf16`` probes for that and skips
with the reason when it is the case. bf16 goes through the same code path as fp16 (only the
element type differs), which the fp16 cases cover.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

_CHILD = os.environ.get("ATTNBENCH_INTERPRET_CHILD") == "1"
_IN_PROCESS = _CHILD or (
    "triton" not in sys.modules and not __import__("torch").cuda.is_available()
)
if _IN_PROCESS:
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

pytest.importorskip("triton")

from interpreter import kernel_tests  # noqa: E402

from attnbench import plugins  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.measure.agreement import bound, error, failed  # noqa: E402
from attnbench.measure.reference import magnitude, reference  # noqa: E402

if _IN_PROCESS:
    from interpreter import broken_reason  # noqa: E402

    _BROKEN = broken_reason()
    from attnbench.impls.triton_flash_fa2 import kernel as tf  # noqa: E402
else:
    tf = None
    _BROKEN = None


interpreted = kernel_tests(_IN_PROCESS, _BROKEN)


@pytest.mark.skipif(_IN_PROCESS, reason="kernel tests run in this process")
def test_interpreted_in_subprocess():
    from interpreter import run_child

    run_child(__file__)


@interpreted
def test_kernels_are_interpreted():
    assert tf.interpreting()


def _inputs(B, Hq, Hkv, Sq, Skv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)  # (B, Hq, Sq, D)
    k = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)  # (B, Hkv, Skv, D)
    v = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)
    do = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)  # (B, Hq, Sq, D)
    return q, k, v, do


def _check_agrees(q, k, v, do, *, causal, dtype, tiles=None, backward=True):
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v = (t.detach().requires_grad_(backward) for t in (q, k, v))
    out = tf.flash_attention(q, k, v, causal=causal, scale=scale, tiles=tiles)
    got = {"out": out}
    if backward:
        got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do)))
    d = do if backward else None
    ref_out, ref_grads = reference(q, k, v, causal=causal, scale=scale, dout=d)
    mags = dict(
        zip(("out", "dq", "dk", "dv"), magnitude(q, k, v, causal=causal, scale=scale, dout=d))
    )
    refs = {"out": ref_out}
    if backward:
        refs.update(zip(("dq", "dk", "dv"), ref_grads))
    bad = []
    for name, ref in refs.items():
        assert got[name].shape == ref.shape and got[name].dtype == dtype, name
        err = error(got[name], ref, mags[name], name)
        fails = failed(err)
        if fails:
            rel_b, abs_b = bound(err)
            bad.append(
                f"{name}: {', '.join(fails)}: rel {err.rel} (bound {rel_b}), max abs "
                f"{err.elem_err:.3g} (bound {abs_b:.3g})"
            )
    assert not bad, "; ".join(bad)


# (Hq, Hkv, Sq, Skv, D, dtype, causal, tiles): ragged lengths, Sq < Skv and Sq > Skv, GQA and
# MQA, every head dim, BLOCK_M > BLOCK_N (default tiles 32x16) and BLOCK_M < BLOCK_N.
CASES = [
    (2, 2, 37, 37, 32, torch.float32, False, None),
    (2, 2, 37, 37, 32, torch.float16, True, None),
    (2, 2, 70, 37, 64, torch.float16, True, None),
    (4, 2, 37, 70, 64, torch.float16, True, None),
    (4, 2, 70, 70, 64, torch.float16, False, None),
    (4, 1, 70, 37, 128, torch.float16, False, None),
    (4, 1, 37, 70, 32, torch.float32, True, (16, 16)),
    (2, 1, 80, 80, 16, torch.float16, True, (16, 32)),
    (2, 2, 64, 48, 16, torch.float16, True, (16, 32)),
    (1, 1, 33, 20, 256, torch.float16, True, None),
]


@interpreted
@pytest.mark.parametrize(
    "Hq,Hkv,Sq,Skv,D,dtype,causal,tiles",
    CASES,
    ids=[
        f"H{c[0]}-{c[1]}_S{c[2]}x{c[3]}_D{c[4]}_{str(c[5])[6:]}_"
        f"{'causal' if c[6] else 'full'}_t{c[7]}"
        for c in CASES
    ],
)
def test_fwd_bwd_agrees(Hq, Hkv, Sq, Skv, D, dtype, causal, tiles):
    q, k, v, do = _inputs(1, Hq, Hkv, Sq, Skv, D, dtype)
    _check_agrees(q, k, v, do, causal=causal, dtype=dtype, tiles=tiles)


@interpreted
def test_forward_only_batch2():
    q, k, v, do = _inputs(2, 2, 2, 21, 45, 32, torch.float16, seed=1)
    _check_agrees(q, k, v, do, causal=True, dtype=torch.float16, backward=False)


@interpreted
def test_strided_inputs():
    # q/k/v/dout as transposed (B, S, H, D) storage: only the last dim is contiguous
    q, k, v, do = (
        t.transpose(1, 2).contiguous().transpose(1, 2)
        for t in _inputs(2, 4, 2, 29, 41, 32, torch.float16, seed=2)
    )
    assert not q.is_contiguous() and q.stride(-1) == 1
    _check_agrees(q, k, v, do, causal=True, dtype=torch.float16)


@interpreted
def test_last_dim_not_contiguous():
    q, k, v, do = _inputs(1, 2, 2, 24, 24, 32, torch.float32, seed=3)
    q = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # stride(-1) != 1
    assert q.stride(-1) != 1
    _check_agrees(q, k, v, do, causal=False, dtype=torch.float32)


@interpreted
def test_lse_matches_logsumexp():
    q, k, v, _ = _inputs(1, 4, 2, 37, 50, 32, torch.float32, seed=4)
    scale = 0.3
    _, lse = tf.forward(q, k, v, causal=True, scale=scale)  # (B, Hq, Sq)
    kk = k.double().repeat_interleave(2, dim=1)  # (B, Hq, Skv, D), reference side only
    s = q.double() @ kk.transpose(-1, -2) * scale
    s = s.masked_fill(torch.ones(37, 50, dtype=torch.bool).triu(1), float("-inf"))
    assert lse.dtype == torch.float32 and lse.shape == (1, 4, 37)
    torch.testing.assert_close(lse.double(), s.logsumexp(-1), rtol=1e-5, atol=1e-5)


def _interpreter_bf16_dot_ok() -> bool:
    a = torch.eye(16, dtype=torch.bfloat16)[None, None]  # (1, 1, 16, 16)
    v = torch.randn(1, 1, 16, 16).to(torch.bfloat16)
    out, _ = tf.forward(a, a, v, causal=False, scale=1.0, tiles=(16, 16))
    ref, _ = reference(a, a, v, causal=False, scale=1.0)
    return float((out.double() - ref).norm() / ref.norm()) < 0.05


@interpreted
def test_bf16():
    if not _interpreter_bf16_dot_ok():
        pytest.skip(
            "Triton's CPU interpreter computes bf16 tl.dot on the raw uint16 bits; "
            "bf16 is checked only on a GPU (every GPU sweep row checks it against the reference)"
        )
    q, k, v, do = _inputs(1, 4, 2, 37, 45, 64, torch.bfloat16, seed=5)
    _check_agrees(q, k, v, do, causal=True, dtype=torch.bfloat16)


@interpreted
def test_rejects_bad_shapes():
    q, k, v, _ = _inputs(1, 3, 2, 8, 8, 32, torch.float32)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        tf.flash_attention(q, k, v)
    q, k, v, _ = _inputs(1, 2, 2, 8, 8, 48, torch.float32)
    with pytest.raises(ValueError, match="head_dim=48"):
        tf.flash_attention(q, k, v)


def test_registered_unsupported_on_cpu():
    impl = plugins.discover(entry_points=False)["triton_flash_fa2"]
    assert impl.available, impl.unavailable
    case = Case(
        batch=1,
        heads=4,
        kv_heads=2,
        seq_q=64,
        seq_kv=64,
        head_dim=64,
        dtype="bfloat16",
        causal=True,
        mode="fwd_bwd",
        device="cpu",
    )
    reasons = impl.reasons(case)
    assert reasons and "device=cpu" in reasons[0], reasons
    assert impl.reasons(Case(1, 4, 2, 64, 64, 64, "bfloat16", True, "fwd_bwd", "cuda")) == []
    assert any("head_dim=48" in r for r in impl.reasons(Case(1, 4, 2, 64, 64, 48, device="cuda")))
