import math

import pytest
import torch

from attnbench.measure import accuracy
from attnbench.measure.accuracy import Error, agrees, bound, error, reference


def dense(q, k, v, causal, scale):
    """Attention written out with a full mask, float64, as a check on the chunked reference."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        s = s.masked_fill(j > i, -math.inf)
    return s.softmax(-1) @ v


@pytest.mark.parametrize(
    "hq,hkv,sq,skv,causal",
    [(2, 2, 33, 33, False), (4, 2, 40, 17, True), (4, 1, 17, 40, True), (2, 2, 50, 50, True)],
)
def test_chunked_reference_matches_dense_formula_and_autograd(
    monkeypatch, hq, hkv, sq, skv, causal
):
    monkeypatch.setattr(accuracy, "CHUNK_BYTES", 7 * 8 * hq * skv)  # 7 query rows per chunk
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, hq, sq, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, hkv, skv, 16, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, hkv, skv, 16, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, hq, sq, 16, generator=g, dtype=torch.float64)
    out, grads = reference(q, k, v, causal=causal, scale=0.25, dout=dout)
    want = dense(q, k, v, causal, 0.25)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)


def test_reference_in_low_precision_keeps_the_dtype():
    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    out, grads = reference(q, q, q, causal=True, scale=0.25, dout=q, dtype=torch.bfloat16)
    assert out.dtype is torch.bfloat16 and all(g.dtype is torch.bfloat16 for g in grads)


def test_error_metrics():
    ref = torch.tensor([3.0, 4.0])
    e = error(torch.tensor([3.0, 4.5]), ref)
    assert e.max_abs == pytest.approx(0.5) and e.rel == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_never_agree(bad):
    ref = torch.ones(4)
    x = torch.tensor([1.0, 1.0, bad, 1.0])
    e = error(x, ref)
    assert not e.finite
    assert not agrees(e, Error(10.0, 10.0, 1.0), torch.float32)  # even with a huge bound


def test_bound_is_twice_the_baseline_plus_a_floor():
    base = Error(max_abs=1e-3, rel=2e-3, ref_max_abs=2.0)
    eps = torch.finfo(torch.bfloat16).eps
    rel_bound, abs_bound = bound(base, torch.bfloat16)
    assert rel_bound == pytest.approx(4e-3 + eps)
    assert abs_bound == pytest.approx(2e-3 + accuracy.ABS_FLOOR_EPS * eps * 2.0)
    assert agrees(Error(1e-3, rel_bound * 0.99, 2.0), base, torch.bfloat16)
    assert not agrees(Error(1e-3, rel_bound * 1.01, 2.0), base, torch.bfloat16)
    assert not agrees(Error(abs_bound * 1.01, 1e-3, 2.0), base, torch.bfloat16)
