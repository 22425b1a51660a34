import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case
from attnbench.masks import Mask
from attnbench.masks.interval import Interval
from attnbench.measure import agreement
from attnbench.measure import reference as reference_module
from attnbench.measure.agreement import (
    LegacyError,
    agrees,
    bound,
    error,
    failed,
    legacy_agrees,
    legacy_bound,
)
from attnbench.measure.reference import Magnitude, coarser_grid, grid, magnitude, reference
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth


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
    monkeypatch.setattr(reference_module, "CHUNK_BYTES", 7 * 8 * hq * skv)  # 7 query rows per chunk
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


def _inputs(dtype, hq=2, hkv=2, sq=64, skv=64, d=64, seed=0):
    """Standard-normal q, k, v, dout rounded to ``dtype`` (as run/measuring/inputs.py makes
    them)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, hq, sq, d), (1, hkv, skv, d), (1, hkv, skv, d), (1, hq, sq, d)]
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _sdpa(q, k, v, scale, causal=False):
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def one_term(m: torch.Tensor) -> Magnitude:
    """A magnitude whose every element is a sum of one term."""
    return Magnitude(m, torch.ones(()))


def test_error_metrics():
    half = agreement.N_STAT // 2  # N_STAT elements: (norm) is the statistical bound
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64).repeat(half)
    x = torch.tensor([3.0, 4.5]).repeat(half)
    e = error(x, ref, one_term(ref.clone()))
    assert e.max_abs == pytest.approx(0.5) and e.rel == pytest.approx(0.1)
    # element-wise: |d_e| against (C_ELEM u + C_ACC_ELEM u_acc sqrt(1)) max(m_e, TAU rms(m))
    u = agreement.unit_roundoff(torch.float32)
    per = agreement.C_ELEM[torch.float32]["out"] * u + agreement.C_ACC_ELEM * u
    assert e.elem_index == (1,) and e.elem_err == pytest.approx(0.5)
    assert e.elem_bound == pytest.approx(per * 4.0)
    # (norm): C_NORM u ||r|| + C_ACC u_acc ||sqrt(n) m||
    r = 5.0 * half**0.5
    want = agreement.C_NORM[torch.float32]["out"] * u * r + agreement.C_ACC * u * r
    assert e.norm_bound == pytest.approx(want) and e.rel_bound == pytest.approx(want / r)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_never_agree_with_any_magnitude(bad):
    ref = torch.ones(4, dtype=torch.float64)
    x = torch.tensor([1.0, 1.0, bad, 1.0])
    e = error(x, ref, one_term(torch.full((4,), 1e30, dtype=torch.float64)))  # a huge magnitude
    assert not e.finite
    assert failed(e) == ["non-finite"]
    assert not agrees(e)


def test_exactly_zero_reference_is_judged_by_an_absolute_bound_from_the_magnitude():
    n = agreement.N_STAT
    ref = torch.zeros(n, dtype=torch.float64)
    mag = one_term(torch.ones(n, dtype=torch.float64))
    u = agreement.unit_roundoff(torch.bfloat16)
    noise = error(torch.full((n,), 0.1 * u), ref, mag, "dq", torch.bfloat16)  # rounding noise
    assert noise.rel is None and noise.near_zero  # never a division by zero
    assert bound(noise)[0] is None
    assert agrees(noise)
    wrong = error(torch.full((n,), 2 * u), ref, mag, "dq", torch.bfloat16)  # 2u ||m|| > C_ZERO
    assert "abs (reference near zero)" in failed(wrong)


def test_one_key_makes_dq_and_dk_zero_and_the_magnitude_is_not():
    q, k, v, dout = _inputs(torch.float32, sq=16, skv=1)
    args = dict(causal=False, scale=0.125, dout=dout)
    out, (dq, dk, dv) = reference(q, k, v, **args)
    mags = magnitude(q, k, v, **args)
    assert dq.abs().max() < 1e-12 and dk.abs().max() < 1e-12
    assert all(bool((m.m >= r.abs() - 1e-12).all()) for m, r in zip(mags, [out, dq, dk, dv]))
    assert mags[1].m.norm() > 0 and mags[2].m.norm() > 0
    e = error(dq.float() + 1e-9, dq, mags[1], "dq")
    assert e.rel is None and math.isfinite(e.abs_ratio) and agrees(e)


def test_a_one_percent_scale_error_in_bfloat16_is_flagged_and_the_correct_result_is_not():
    q, k, v, _ = _inputs(torch.bfloat16)
    ref = _sdpa(q, k, v, 0.125)
    (mag,) = magnitude(q, k, v, causal=False, scale=0.125)
    right = error(_sdpa(q, k, v, 0.125).to(torch.bfloat16), ref, mag)
    wrong = error(_sdpa(q, k, v, 0.125 * 1.01).to(torch.bfloat16), ref, mag)
    assert agrees(right)
    assert "rel" in failed(wrong)
    assert wrong.rel > bound(wrong)[0]


def test_one_wrong_element_fails_max_abs_but_not_rel():
    q, k, v, _ = _inputs(torch.float32, hq=4, hkv=2)
    ref = _sdpa(q, k, v, 0.125)
    (mag,) = magnitude(q, k, v, causal=False, scale=0.125)
    x = ref.float()
    x[0, 1, 5, 3] += 1e-5  # 170 u, at one element: lost in the norm, not against its magnitude
    e = error(x, ref, mag)
    assert failed(e) == ["max-abs"]
    assert e.elem_index == (0, 1, 5, 3)
    assert e.elem_err > bound(e)[1]


@pytest.mark.parametrize(
    "causal,window,padded", [(False, None, False), (True, 10, False), (True, None, True)]
)
def test_chunked_magnitude_matches_one_chunk(monkeypatch, causal, window, padded):
    q, k, v, dout = _inputs(torch.float32, hq=4, hkv=2, sq=30, skv=23, d=16)
    q, k, v, dout = (t.repeat(2, 1, 1, 1) for t in (q, k, v, dout))  # batch 2
    kv_lens = torch.tensor([23, 11]) if padded else None
    mask = Mask(layout=Interval(30, 23, 2, window=window, kv_lens=kv_lens))
    args = dict(causal=causal, scale=0.25, dout=dout, mask=mask)
    whole = magnitude(q, k, v, **args)
    monkeypatch.setattr(reference_module, "CHUNK_BYTES", 7 * 8 * 2 * 4 * 23)  # 7 query rows a chunk
    for a, b in zip(whole, magnitude(q, k, v, **args)):
        torch.testing.assert_close(a.m, b.m, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a.terms, b.terms, rtol=0, atol=0)


def test_the_magnitude_counts_the_terms_of_each_sum():
    """out and dq of query i add the keys it sees; dk and dv of key j add the (query, head)
    pairs that see it: here causal bottom-right, 5 queries after 3 cached keys, GQA 2:1."""
    q, k, v, dout = _inputs(torch.float32, hq=4, hkv=2, sq=5, skv=8, d=8)
    bottom_right = Mask(align="bottom_right")  # query i at position i + 3
    mags = magnitude(q, k, v, causal=True, scale=0.3, dout=dout, mask=bottom_right)
    seen = torch.tensor([4.0, 5, 6, 7, 8], dtype=torch.float64)  # query i sees keys j <= i + 3
    for m in mags[:2]:  # out, dq: (B, Hq, Sq, 1)
        assert torch.equal(m.terms, seen.view(1, 1, 5, 1).expand(1, 4, 5, 1))
    seeing = torch.tensor([5.0, 5, 5, 5, 4, 3, 2, 1], dtype=torch.float64) * 2  # 2 heads a group
    for m in mags[2:]:  # dk, dv: (B, Hkv, Skv, 1)
        assert torch.equal(m.terms, seeing.view(1, 1, 8, 1).expand(1, 2, 8, 1))
    assert all(m.under is None for m in mags)  # no float32 probability is below 1e-38


def test_float16_probabilities_below_its_smallest_normal_number_are_counted():
    """Over 32k keys every probability is below float16's smallest normal number (6.1e-5),
    where it is stored with an absolute precision: the magnitude has an ``under`` part, which
    float32 (smallest normal 1.2e-38) does not."""
    q, k, v, _ = _inputs(torch.float16, hq=2, hkv=1, sq=1, skv=32768, d=16)
    (half,) = magnitude(q, k, v, causal=False, scale=0.25)
    (single,) = magnitude(q.float(), k.float(), v.float(), causal=False, scale=0.25)
    assert single.under is None
    assert half.under is not None and bool((half.under > 0).all())
    torch.testing.assert_close(half.m - half.under, single.m)


def test_legacy_bound_is_twice_the_baseline_plus_a_floor():
    """Level layer keeps this rule (docs/method.md)."""
    base = LegacyError(max_abs=1e-3, rel=2e-3, ref_max_abs=2.0)
    eps = torch.finfo(torch.bfloat16).eps
    rel_bound, abs_bound = legacy_bound(base, torch.bfloat16)
    assert rel_bound == pytest.approx(4e-3 + eps)
    assert abs_bound == pytest.approx(2e-3 + agreement.ABS_FLOOR_EPS * eps * 2.0)
    assert legacy_agrees(LegacyError(1e-3, rel_bound * 0.99, 2.0), base, torch.bfloat16)
    assert not legacy_agrees(LegacyError(1e-3, rel_bound * 1.01, 2.0), base, torch.bfloat16)
    assert not legacy_agrees(LegacyError(abs_bound * 1.01, 1e-3, 2.0), base, torch.bfloat16)


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))


def test_the_grid_is_the_spacing_unit_of_the_binade_a_value_lands_in():
    x = torch.tensor([16.5, 15.9, -17.0, 0.75, 0.0], dtype=torch.float64)
    assert grid(x).tolist() == [16.0, 8.0, 16.0, 0.5, 0.0]
    raw = torch.tensor([1.5, 1.5, 30.0], dtype=torch.float64)
    modded = torch.tensor([17.5, 15.5, 25.0], dtype=torch.float64)  # the last: a soft-cap
    # on a coarser grid than the raw score: that grid; on its own or a finer one: nothing
    assert coarser_grid(raw, modded, modded - raw).tolist() == [16.0, 8.0, 0.0]


@pytest.mark.parametrize(
    "score_mod, impl, seed",
    [("ramp:17", "naive", 0), ("ramp:34", "naive", 0), ("ramp:34", "sdpa", 3)],
)
def test_a_bias_that_lifts_the_dominant_scores_just_above_a_power_of_two_is_no_false_alarm(
    score_mod, impl, seed
):
    """A ramp:K bias in [0, K] per (head, key) (scripts/calibrate_accuracy.py's modifier, as a
    plugin may add one) puts the dominant scores in [16, 17.6] (ramp:17) or [32, 35]
    (ramp:34), the coarser half of their binade: naive rounds them there
    in bfloat16 (the modifier term, sized by that grid), and SDPA rounds each key's bias once
    for every query (the bias criterion's modifier term). Both are correct."""
    calibrate = pytest.importorskip("calibrate_accuracy")  # keeps the ramp modifier
    impls = plugins.discover(entry_points=False)
    case = Case(1, 8, 2, 64, 512, 64, dtype="bfloat16", causal=True, mode="fwd", device="cpu")
    with calibrate.calibration_mods():
        case = replace(case, causal_align="bottom_right", score_mod=score_mod)
        inputs = make_inputs(case, seed)
        truth = ground_truth(case, inputs)
        out, _ = Call.prepare(impls[impl], case, inputs).check()
    verdict = agreement.judge(case, [out], truth)
    assert verdict.agrees, verdict.notes
    (err,) = verdict.errors
    assert err.mod_norm > 0 and err.bias_bound > agreement.C_BIAS[torch.bfloat16] * 2.0**-8
