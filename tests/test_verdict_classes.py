"""The agreement rule on the classes of case the calibration grid once lacked (docs/method.md,
"The agreement rule"): a GQA kv head's gradient summed over 8 query heads, outputs of a few
elements, scores in the hundreds and multiplied ones, and the floor no output of zeros
passes. Each case here was a false alarm (or a zero output that agreed) under the previous
rule; the modifiers are the calibration's own (scripts/calibrate_accuracy.py)."""

import sys
from pathlib import Path

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import agreement
from attnbench.measure.reference import group_walk
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
calibrate = pytest.importorskip("calibrate_accuracy")
BR = "bottom_right"


@pytest.fixture(scope="module")
def impls():
    return plugins.discover(entry_points=False)


def verdict(impl, case: Case, seed: int, zero: bool = False):
    """The verdict a row gets (agreement.judge) on ``impl``'s call, or on zeros."""
    with calibrate.calibration_mods():
        inputs = make_inputs(case, seed)
        truth = ground_truth(case, inputs)
        if zero:
            got = [torch.zeros_like(r, dtype=case.torch_dtype) for r in truth.ref]
        else:
            out, grads = Call.prepare(impl, case, inputs).check()
            got = [out, *(grads or ())]
        return agreement.judge(case, got, truth)


def case(*shape, **kw) -> Case:
    with calibrate.calibration_mods():
        return Case(*shape, dtype="bfloat16", device="cpu", **kw)


def test_a_gqa_kv_gradient_summed_over_eight_query_heads_is_no_false_alarm(impls):
    """sdpa's CPU flash backward adds each query head's part into the bfloat16 dk, dv: its
    dv rel error was 0.00997 against a bound of 0.00977 (`attnbench sweep --impls sdpa
    --heads 16 --kv-heads 2 --seq-len 512 --head-dim 40 --dtype bfloat16 --causal true
    --mode bwd --seed 1`); the bound now adds the walk of that sum over the group."""
    v = verdict(impls["sdpa"], case(1, 16, 2, 512, 512, 40, causal=True, mode="bwd"), seed=1)
    assert v.agrees, v.notes
    dv = v.errors[3]
    assert dv.group_norm > dv.ref_norm  # the sum over 8 heads: about sqrt(8 / 2) ||dv||
    assert dv.norm_share < 0.8


def test_the_group_walk_is_the_walk_of_the_running_sums():
    a, b = torch.tensor(3.0), torch.tensor(-1.0)
    per_head = torch.stack([a, b]).double().reshape(1, 2, 1, 1)  # (B, Hq, Skv, D), 2:1
    assert group_walk(per_head, kv_heads=1).item() == pytest.approx((a**2 + (a + b) ** 2) ** 0.5)
    assert group_walk(per_head, kv_heads=2) is None  # no GQA: no sum over heads


@pytest.mark.parametrize("seed", [2, 7, 14, 17])
def test_an_output_of_eight_elements_is_judged_by_what_holds_there(impls, seed):
    """Decode with one head of dim 8: the textbook formula in bfloat16 failed (norm) or
    (bias), statistics of many elements; below N_STAT elements only the element-wise
    criterion and the floor stand."""
    v = verdict(impls["naive"], case(1, 1, 1, 1, 256, 8, causal=True, causal_align=BR), seed)
    assert v.agrees, v.notes
    assert not v.errors[0].statistical and v.errors[0].bias_bound is None


def test_a_small_output_still_fails_on_a_wrong_element_and_on_zeros(impls):
    small = case(1, 1, 1, 1, 256, 8, causal=True, causal_align=BR)
    with calibrate.calibration_mods():
        inputs = make_inputs(small, 0)
        truth = ground_truth(small, inputs)
    ref, mag = truth.ref[0], truth.mag[0]
    wrong = ref.clone()
    wrong[0, 0, 0, 3] += 0.05  # a few dozen u at one element
    assert agreement.failed(agreement.error(wrong, ref, mag, "out", torch.bfloat16)) == ["max-abs"]
    assert not verdict(impls["naive"], small, 0, zero=True).agrees


@pytest.mark.parametrize("seed", [1, 3])
def test_scores_in_the_hundreds_get_the_modifier_term_at_each_element(impls, seed):
    """ramp:260 puts the dominant scores in [256, 260], where bfloat16 rounds in steps of 1:
    the textbook formula failed max-abs, whose bound had no modifier term."""
    v = verdict(impls["naive"], case(1, 4, 4, 128, 128, 64, score_mod="ramp:260"), seed)
    assert v.agrees, v.notes


@pytest.mark.parametrize(("impl", "seed"), [("naive", 2), ("naive", 7), ("tiled", 3)])
def test_a_multiplied_score_on_decode_is_no_bias_false_alarm(impls, impl, seed):
    """s -> 4 s on one query over 2048 keys: 4 rows, whose rounding along the reference does
    not average out; the bias criterion's modifier term is a walk over rows."""
    shape = case(1, 4, 1, 1, 2048, 128, causal=True, causal_align=BR, score_mod="temp:4")
    v = verdict(impls[impl], shape, seed)
    assert v.agrees, v.notes


@pytest.mark.parametrize("mod", ["ramp:520", "ramp:1040"])
def test_no_output_of_zeros_agrees_however_large_the_modifier(mod):
    """With scores in the thousands the modifier's term alone exceeded ||ref||, and zeros
    agreed; the floor holds every bound under FAR ||ref||."""
    v = verdict(None, case(1, 4, 4, 128, 128, 64, score_mod=mod), 0, zero=True)
    assert v.agrees is False
    e = v.errors[0]
    assert e.norm_bound <= agreement.FAR * e.ref_norm and "rel" in v.failures[0]
