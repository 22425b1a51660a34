"""Disagreements that explain themselves (measure/diagnose.py): an impl with one planted
convention bug gets a row whose reason names exactly that convention; a correct impl and a
random wrong output get no diagnosis; a compiled impl's row says whether its eager form
agrees."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from attnbench import registry
from attnbench.case import Case
from attnbench.masks import ANY, offset
from attnbench.measure import diagnose
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth
from attnbench.testing import run_row


def planted(q, k, v, *, causal, scale, mask=None, bug=None):
    """Attention in the case dtype, right but for ``bug``. q (B, Hq, Sq, D); k, v (B, Hkv,
    Skv, D)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    heads = torch.arange(Hq)
    heads = heads % Hkv if bug == "kv_head_mod" else heads // (Hq // Hkv)
    kk, vv = k[:, heads], v[:, heads]  # (B, Hq, Skv, D)
    s = (q @ kk.transpose(-1, -2)) * (1.0 if bug == "scale_1" else scale)  # (B, Hq, Sq, Skv)
    align = "top_left" if mask is None else mask.align
    if bug == "causal_align":
        align = "top_left" if align == "bottom_right" else "bottom_right"
    i = torch.arange(Sq)[:, None] + offset(align, Sq, Skv)
    j = torch.arange(Skv)[None, :]
    if mask is not None and mask.score_mod is not None and bug != "score_mod_missing":
        s = mask.score_mod.apply(s, torch.arange(Hq)[:, None, None], i, j)
    diagonal = {"diagonal_plus_1": 1, "diagonal_minus_1": -1}.get(bug, 0)  # triu(2), triu(0)
    drop = (j > i + diagonal) if causal else torch.zeros(Sq, Skv, dtype=torch.bool)
    if mask is not None and mask.kind == "window":
        w = mask.window + {"window_plus_1": 1, "window_minus_1": -1}.get(bug, 0)
        drop = drop | ((i - j >= w) if causal else ((i - j).abs() >= w))
    empty = drop.all(-1, keepdim=True)  # (Sq, 1)
    fill = torch.finfo(s.dtype).min if bug == "keyless_uniform" else float("-inf")
    p = s.masked_fill(drop, fill).softmax(-1)
    if bug not in ("keyless_uniform", "keyless_nan", "diagonal_minus_1"):  # NaN there
        p = p.masked_fill(empty, 0.0)
    out = p @ vv  # (B, Hq, Sq, D)
    if bug == "transpose":
        return out.transpose(1, 2).reshape(B, Hq, Sq, D)  # (B, Sq, Hq, D) values as bhsd
    if bug == "random":
        return torch.randn_like(out)
    return out


@pytest.fixture
def register(registered):
    """Registers ``planted`` with ``bug`` under a test name; no impl is left behind."""

    def make(bug, compiled=None):
        """``compiled``: a torch.compile'd function the output passes through (COMPILED)."""

        def fn(q, k, v, *, causal, scale, mask=None):
            out = planted(q, k, v, causal=causal, scale=scale, mask=mask, bug=bug)
            return out if compiled is None else compiled(out)

        name = f"planted_{bug or 'none'}" + ("" if compiled is None else f"_{compiled.__name__}")
        registry.register(
            name,
            masks=("window",),
            score_mods=ANY,
            causal_align=("bottom_right",),
            backward=False,
            compiled=compiled is not None,
        )(fn)
        return registry._IMPLS[name]

    return make


BASE = dict(batch=2, heads=4, kv_heads=2, seq_q=8, seq_kv=8, head_dim=8)
CASES = {
    "causal_align": Case(**{**BASE, "seq_kv": 12}, causal=True, causal_align="bottom_right"),
    "kv_head_mod": Case(**BASE),
    "window_plus_1": Case(**{**BASE, "seq_q": 12, "seq_kv": 12}, mask="window", pattern="4"),
    "window_minus_1": Case(**BASE, causal=True, mask="window", pattern="3"),
    "keyless_uniform": Case(
        **{**BASE, "seq_q": 12, "seq_kv": 4}, causal=True, causal_align="bottom_right"
    ),  # fmt: skip
    "keyless_nan": Case(
        **{**BASE, "seq_q": 12, "seq_kv": 4}, causal=True, causal_align="bottom_right"
    ),  # fmt: skip
    "scale_1": Case(**BASE, causal=True),
    "diagonal_plus_1": Case(**BASE, causal=True),
    "diagonal_minus_1": Case(**BASE, causal=True),
    "transpose": Case(**BASE),
    "score_mod_missing": Case(**BASE, causal=True, score_mod="softcap:1"),  # planted ignores it
}
MESSAGES = {  # what the note must say, per convention
    "causal_align": "out matches top-left causal; declared bottom-right",
    "kv_head_mod": "out matches kv head h % Hkv for query head h",
    "window_plus_1": "out matches window 5; declared window 4",
    "window_minus_1": "out matches window 2; declared window 3",
    "keyless_uniform": "out matches the mean of all keys' values in the 64 rows",
    "keyless_nan": "out matches NaN in the 64 rows with no visible key",
    "scale_1": "out matches scale 1; declared",
    "diagonal_plus_1": "out matches the causal diagonal shifted by +1: each query also sees the "
    "next key",
    "diagonal_minus_1": "out matches the causal diagonal shifted by -1: each query misses its "
    "own key, NaN in the 8 rows it leaves with no key",
    "transpose": "out matches when read in (B, S, H, D) order: a missing transpose",
    "score_mod_missing": "out matches without score_mod softcap:1; declared softcap:1",
}


def verdict(impl, case, dtype="float32"):
    """The verdict alone, as the row's judge step makes it (faster than a whole row)."""
    case = dataclasses.replace(case, dtype=dtype)
    inputs = make_inputs(case, 0)
    out, _ = Call.prepare(impl, case, inputs).check()
    return diagnose.judge(case, inputs, [out], ground_truth(case, inputs))


def test_every_convention_has_a_planted_bug():
    tried = {c.name for c in diagnose.conventions()} - {"scale_rsqrt_d"}  # no case scales else
    assert tried == set(CASES) == set(MESSAGES)


@pytest.mark.parametrize("bug", sorted(CASES))
def test_a_planted_convention_bug_is_named(register, bug):
    case = CASES[bug]
    r = run_row(register(bug), case)
    assert r["status"] == "ok" and r["agrees"] is False, r["reason"]
    assert "disagrees with the float64 reference" in r["reason"]
    assert MESSAGES[bug] in r["reason"], r["reason"]
    assert r["reason"].count("out matches") == 1, r["reason"]  # that convention alone


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("bug", sorted(CASES))
def test_the_half_types_name_the_same_convention(register, bug, dtype):
    v = verdict(register(bug), CASES[bug], dtype)
    assert v.agrees is False
    assert [n for n in v.notes if "out matches" in n] == [
        n for n in v.notes if MESSAGES[bug] in n
    ], v.notes
    assert len([n for n in v.notes if "out matches" in n]) == 1, v.notes
    assert verdict(register(None), CASES[bug], dtype).agrees is True


@pytest.mark.parametrize("bug", sorted(CASES))
def test_a_correct_impl_gets_no_diagnosis(register, bug):
    v = verdict(register(None), CASES[bug])
    assert v.agrees is True, v.notes
    assert not [n for n in v.notes if "out matches" in n]


@pytest.mark.parametrize("bug", sorted(CASES))
def test_a_random_output_gets_no_false_diagnosis(register, bug):
    v = verdict(register("random"), CASES[bug])
    assert v.agrees is False
    assert not [n for n in v.notes if "out matches" in n], v.notes


def test_a_custom_scale_is_tried_against_one_over_sqrt_d(register):
    """The case's scale is 1 / sqrt(D); an output computed at scale 1 read back with the
    inputs' scale set to 1 matches 1 / sqrt(D) instead."""
    case = CASES["scale_1"]
    inputs = make_inputs(case, 0)
    out, _ = Call.prepare(register(None), case, inputs).check()  # at 1 / sqrt(D)
    ones = type(inputs)(inputs.q, inputs.k, inputs.v, None, scale=1.0, mask=inputs.mask)
    truth = ground_truth(case, ones)
    verdict = diagnose.judge(case, ones, [out], truth)
    assert verdict.agrees is False
    assert [n for n in verdict.notes if "out matches" in n] == [
        "out matches scale 1/sqrt(D); declared 1"
    ]


def test_out_of_memory_stops_the_diagnosis_not_the_row(register, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("planted")

    monkeypatch.setattr(diagnose, "reference", no_memory)
    r = run_row(register("causal_align"), CASES["causal_align"])
    assert r["status"] == "ok" and r["agrees"] is False
    assert "no diagnosis past causal_align: out of memory" in r["reason"], r["reason"]


# Compiled with the eager backend (no code generation, fast): under torch.compile each is
# traced with is_compiling() true, with torch.compile off (measure/compiling.eagerly) it runs
# as written.
@torch.compile(backend="eager", dynamic=False)
def wrong_compiled(out):
    return out * 1.5 if torch.compiler.is_compiling() else out


@torch.compile(backend="eager", dynamic=False)
def right_compiled(out):
    return out


@torch.compile(backend="eager", dynamic=False)
def failing_eager(out):
    if not torch.compiler.is_compiling():
        raise RuntimeError("planted eager failure")
    return out * 1.5


COMPILED = {  # what: (planted bug, compiled function, what the row's reason must say)
    "compiler wrong": (
        None,
        wrong_compiled,
        "eager agrees: the compiled output is wrong (torch.compile, torch ",
    ),
    "both wrong": (
        "scale_1",
        wrong_compiled,
        "eager disagrees too: the impl is wrong with torch.compile off as well (torch.compile, ",
    ),
    "eager fails": (None, failing_eager, "eager not checked: RuntimeError: planted eager failure"),
}


@pytest.mark.parametrize("what", sorted(COMPILED))
def test_a_compiled_impls_disagreement_says_whether_eager_agrees(register, what):
    bug, compiled, message = COMPILED[what]
    r = run_row(register(bug, compiled), CASES["scale_1"])
    assert r["status"] == "ok" and r["agrees"] is False, r["reason"]
    assert message in r["reason"], r["reason"]
    if "torch.compile, " in message:
        assert f"torch.compile, torch {torch.__version__})" in r["reason"]
    assert r["recompiled"] is False  # the eager call left the compiled code as it was


def test_an_agreeing_compiled_impl_is_not_run_eagerly(register, monkeypatch):
    def never(*args):
        raise AssertionError("the eager form ran on an agreeing row")

    monkeypatch.setattr(diagnose, "eager_note", never)
    r = run_row(register(None, right_compiled), CASES["scale_1"])
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]


def test_a_convention_indistinguishable_from_the_declared_one_explains_nothing():
    """s -> 32 s (the calibration's temp modifier) makes decode's softmax nearly one-hot, so
    scale 1 gives the same output as the declared 1/sqrt(D) within the rule's bound: a
    miss is not explained by a scale the impl never used."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    calibrate = pytest.importorskip("calibrate_accuracy")
    with calibrate.calibration_mods():
        case = Case(
            1, 4, 1, 1, 2048, 64, dtype="bfloat16", causal=True, causal_align="bottom_right",
            mode="fwd", device="cpu", score_mod="temp:32",
        )  # fmt: skip
        inputs = make_inputs(case, 0)
        truth = ground_truth(case, inputs)
        assert diagnose.explain(case, inputs, truth.ref[0].to(torch.bfloat16), truth) == []
