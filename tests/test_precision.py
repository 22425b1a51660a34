"""The precision figure (measure/precision.py): a kernel that keeps its running output in the
half type passes the agreement rule on rows of 2k keys in bfloat16, and its row flags it as
precision below an fp32-accumulating kernel, a flag apart from agrees; correct kernels stay
near 1 and are not flagged; float32 rows have no figure."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.measure import precision
from attnbench.testing import run_row

PLUGINS = Path(__file__).resolve().parent / "plugins"
# 32 key tiles of half_acc's 64 keys (it must be flagged from 16 on)
CASE = Case(1, 4, 4, 64, 2048, 64, dtype="bfloat16", mode="fwd", device="cpu")


@pytest.fixture(scope="module")
def impls():
    return plugins.discover(entry_points=False, plugins=[str(PLUGINS / "half_acc.py")])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_type_accumulator_agrees_and_is_flagged(impls, dtype):
    row = run_row(impls["half_acc"], replace(CASE, dtype=dtype))
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert row["precision_low"] is True
    assert row["precision_ratio"] > precision.PRECISION_LIMIT
    assert precision.FLAG in row["reason"]


@pytest.mark.parametrize("impl", ["sdpa", "tiled", "naive"])
def test_correct_kernels_are_not_flagged(impls, impl):
    row = run_row(impls[impl], CASE)
    assert row["agrees"] is True and row["precision_low"] is False
    assert 0.5 < row["precision_ratio"] <= precision.PRECISION_LIMIT
    assert precision.FLAG not in (row["reason"] or "")


def test_float32_rows_and_score_modifiers_have_no_figure(impls):
    for case in (replace(CASE, dtype="float32"), replace(CASE, score_mod="alibi")):
        row = run_row(impls["sdpa"], case)
        assert row["agrees"] is True
        assert row.get("precision_ratio") is None and row.get("precision_low") is None


def test_the_emulated_kernel_accumulates_in_float32_and_rounds_its_probabilities():
    """Its output is the case dtype's rounding of P V, P rounded to that dtype before the
    product and the sums in float32: within one rounding of out of the float64 reference
    where every probability is exact in the dtype (two keys, equal scores: P = 1/2)."""
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 1, 1, 8).bfloat16()
    k = torch.randn(1, 1, 2, 8, generator=g).bfloat16()
    v = torch.randn(1, 1, 2, 8, generator=g).bfloat16()
    out = precision.emulated(q, k, v, causal=False, scale=1.0)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ((v[..., 0, :].float() + v[..., 1, :].float()) / 2).bfloat16()[None])
    assert precision.emulated(q.float(), k.float(), v.float(), causal=False, scale=1.0) is None


def test_queries_that_see_no_key_leave_the_figure_defined(impls):
    """Sq > Skv, bottom-right causal: 63 of 100 queries see no key (out and its magnitude
    zero); the figure is taken over the others."""
    case = Case(1, 2, 2, 100, 37, 64, dtype="bfloat16", causal=True, mode="fwd", device="cpu")
    row = run_row(impls["sdpa"], replace(case, causal_align="bottom_right"))
    assert row["agrees"] is True and 0.5 < row["precision_ratio"] < precision.PRECISION_LIMIT


def test_a_decode_row_of_sixteen_outputs_gets_no_figure(impls):
    """Two heads of dim 8 over 512 keys: the figure was a ratio of two maxima over a few
    elements, 3.76 for `tiled` (flagged, with a guess at its cause); a figure needs
    MIN_ELEMENTS elements to pool."""
    case = Case(1, 2, 1, 1, 512, 8, dtype="bfloat16", causal=True, mode="fwd", device="cpu")
    row = run_row(impls["tiled"], replace(case, causal_align="bottom_right"), seed=6)
    assert row["agrees"] is True
    assert row.get("precision_ratio") is None and row.get("precision_low") is None


def test_a_wrong_result_is_a_disagreement_not_a_precision_flag():
    """A plugin that ignores causal disagrees; its row has no precision figure or note."""

    def no_causal(q, k, v, *, causal, scale):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    impl = registry.Impl("no_causal", no_causal)
    row = run_row(impl, replace(CASE, causal=True, seq_kv=64))
    assert row["agrees"] is False
    assert row.get("precision_ratio") is None and row.get("precision_low") is None
    assert "precision" not in row["reason"]


def test_the_note_says_what_was_measured():
    text = precision.note(3.1, 512)
    assert "rms error over the 512 elements" in text and "3.1x" in text
    assert "accumulator" not in text  # a measurement, not a guess at its cause
