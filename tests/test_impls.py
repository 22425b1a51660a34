"""Every impl that runs on the CPU against the float64 reference, through the sweep's own
measure() so the agreement rule under test is the one the CSV uses."""

import itertools
import textwrap
import time

import pytest
import torch
import torch.nn.functional as F

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.measure import agreement
from attnbench.measure.memory import peak_mem_mib
from attnbench.measure.timing import TimerConfig
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.layer import layer_reference
from attnbench.run.measuring.row import Settings
from attnbench.testing import FAST, run_row, run_rows

SHAPES = [  # (heads, kv_heads, seq_q, seq_kv, head_dim)
    (2, 2, 64, 64, 32),
    (4, 2, 80, 48, 16),  # GQA, seq_q > seq_kv
    (4, 1, 40, 100, 64),  # MQA, seq_q < seq_kv
    (2, 2, 300, 300, 16),  # several tiles, ragged last one
]


def cases(dtypes=("float32",)):
    for (h, hkv, sq, skv, d), causal, mode, dtype in itertools.product(
        SHAPES, (False, True), ("fwd", "fwd_bwd"), dtypes
    ):
        yield Case(
            batch=2,
            heads=h,
            kv_heads=hkv,
            seq_q=sq,
            seq_kv=skv,
            head_dim=d,
            causal=causal,
            mode=mode,
            dtype=dtype,
        )


@pytest.mark.parametrize("name", ["naive", "sdpa", "tiled"])
@pytest.mark.parametrize("case", list(cases()), ids=Case.label)
def test_impl_agrees_with_reference(impls, name, case):
    check_agrees(impls[name], case)


def check_agrees(impl, case):
    row = run_row(impl, case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert row["rel_err"] <= row["err_bound"]
    assert row["time_ms"] > 0 and row["peak_mem_mib"] >= 0
    assert row["recompiled"] is False
    return row


MASKED_SHAPES = [  # (heads, kv_heads, seq_q, seq_kv, head_dim, window)
    (4, 2, 80, 48, 16, 40),  # GQA, seq_q > seq_kv: the window must reach back to the keys
    (2, 2, 160, 160, 16, 50),  # two query tiles, ragged last one (small tiles: see below)
]


def masked_cases(mode="fwd_bwd", shapes=MASKED_SHAPES):
    for (h, hkv, sq, skv, d, w), causal, mask in itertools.product(
        shapes, (False, True), ("padding", "window")
    ):
        yield Case(
            batch=3,
            heads=h,
            kv_heads=hkv,
            seq_q=sq,
            seq_kv=skv,
            head_dim=d,
            causal=causal,
            mode=mode,
            mask=mask,
            pattern=str(w) if mask == "window" else None,
        )


@pytest.mark.parametrize("name", ["naive", "sdpa", "tiled", "sdpa_flash", "sdpa_math"])
@pytest.mark.parametrize("case", list(masked_cases()), ids=Case.label)
def test_impl_agrees_with_reference_under_masks(impls, name, case):
    check_agrees(impls[name], case)


@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_math"])
@pytest.mark.parametrize(
    "case", [c for c in cases() if c.mode == "fwd_bwd" and c.cross], ids=Case.label
)
def test_forced_sdpa_backends_agree_on_the_cpu(impls, name, case):
    row = check_agrees(impls[name], case)
    assert row["backend"] == name.split("_")[1]


@pytest.mark.parametrize(
    "case", list(masked_cases(shapes=[(2, 2, 100, 100, 16, 20)])), ids=Case.label
)
def test_tiled_with_small_blocks_skips_and_masks_blocks_correctly(impls, monkeypatch, case):
    """Blocks smaller than the window: whole key blocks skipped, rows whose first key
    blocks are all masked (their running max still -inf), partly masked blocks."""
    globals_ = impls["tiled"].fn.__globals__
    monkeypatch.setitem(globals_, "BLOCK_Q", 16)
    monkeypatch.setitem(globals_, "BLOCK_K", 8)
    check_agrees(impls["tiled"], case)


@pytest.mark.parametrize("name", ["sdpa", "tiled"])
@pytest.mark.parametrize("case", [c for c in cases(("bfloat16",)) if c.seq_q <= 80], ids=Case.label)
def test_impl_agrees_in_bfloat16(impls, name, case):
    row = run_row(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]


def test_xformers_says_gqa_backward_is_unsupported_before_running(impls):
    case = Case(
        batch=1, heads=8, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16, mode="fwd_bwd", device="cuda"
    )
    reasons = impls["xformers"].check(case)
    assert reasons and "no backward operator" in reasons[0]
    assert impls["xformers"].check(Case(**{**case.as_dict(), "mode": "fwd"})) == []


CAUSAL_CROSS = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=96, head_dim=32, causal=True)
WRONG = {  # name -> (the keys it keeps, the causal case that catches it)
    # bottom-right causal alignment instead of top-left: only differs when seq_q != seq_kv
    "wrong_align": ("j <= i + (s.shape[-1] - s.shape[-2])", CAUSAL_CROSS),
    # off-by-one diagonal: each query also sees the next key
    "wrong_diag": ("j <= i + 1", CAUSAL_CROSS),
    # sliding window one key too narrow: i - W + 1 < j <= i instead of i - W < j <= i
    "wrong_window": (
        "(j >= i - mask.window + 2) & (j <= i)",
        Case(
            batch=3,
            heads=2,
            kv_heads=2,
            seq_q=48,
            seq_kv=48,
            head_dim=16,
            causal=True,
            mask="window",
            pattern="8",
        ),
    ),
    # key padding that also keeps the first padded key
    "wrong_padding": (
        "(j <= mask.kv_lens[:, None, None, None]) & (j <= i)",
        Case(
            batch=3,
            heads=2,
            kv_heads=2,
            seq_q=48,
            seq_kv=48,
            head_dim=16,
            causal=True,
            mask="padding",
        ),
    ),
}


@pytest.mark.parametrize("bug", sorted(WRONG))
def test_agreement_rule_catches_a_wrong_impl(tmp_path, bug):
    keep, case = WRONG[bug]
    path = tmp_path / f"{bug}.py"
    path.write_text(
        textwrap.dedent(f"""
        import torch
        from attnbench.registry import register

        @register("{bug}", masks=("padding", "window"))
        def impl(q, k, v, *, causal, scale, mask):
            s = q @ k.transpose(-1, -2) * scale
            i = torch.arange(s.shape[-2])[:, None]
            j = torch.arange(s.shape[-1])[None, :]
            return s.masked_fill(~({keep}), float("-inf")).softmax(-1) @ v
    """)
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)[bug]
    row = run_row(impl, case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is False
    assert "disagrees with the float64 reference: out " in row["reason"]
    assert row["rel_err"] > row["err_bound"] or row["max_abs_err"] > row["max_abs_bound"]


def test_a_row_failing_only_max_abs_carries_its_bound_and_names_it(tmp_path):
    """One element off by 170 u: lost in the norm, caught against its own magnitude."""
    path = tmp_path / "one_element.py"
    path.write_text(
        textwrap.dedent("""
        import torch.nn.functional as F
        from attnbench.registry import register

        @register("one_element")
        def impl(q, k, v, *, causal, scale):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            out = out.clone()
            out[0, 1, 5, 3] += 1e-5
            return out
    """)
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["one_element"]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=64, head_dim=32)
    row = run_row(impl, case)
    assert row["status"] == "ok" and row["agrees"] is False
    assert "out max-abs" in row["reason"] and "at (0, 1, 5, 3)" in row["reason"]
    assert "out rel" not in row["reason"]
    assert row["max_abs_err"] > row["max_abs_bound"] > 0
    assert row["rel_err"] <= row["err_bound"]


DEGENERATE = [  # (seq_q, seq_kv, causal): the true dq and dk are exactly zero
    (300, 1, False),
    (300, 1, True),
    (1, 300, True),
    (1, 1, False),
]


@pytest.mark.parametrize("name", ["naive", "sdpa", "sdpa_math", "tiled"])
@pytest.mark.parametrize("sq,skv,causal", DEGENERATE)
def test_degenerate_cases_agree_with_finite_errors(impls, name, sq, skv, causal):
    case = Case(
        batch=1, heads=2, kv_heads=2, seq_q=sq, seq_kv=skv, head_dim=16, causal=causal, mode="bwd"
    )
    row = run_row(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert (
        "dq: the reference is zero" in row["reason"]
        and "dk: the reference is zero" in (row["reason"])
    )
    # out, dv: dv of one key has 32 elements, under N_STAT, so its rel bound is the floor
    # (FAR) and max-abs judges it, within a bound that is finite, not astronomical
    assert row["rel_err"] is not None and row["rel_err"] <= row["err_bound"] <= agreement.FAR
    assert row["rel_err"] < 1e-5
    assert 0 <= row["max_abs_err"] <= row["max_abs_bound"] < 0.1


LAYER_IMPLS = ["naive", "sdpa", "sdpa_flash", "sdpa_math", "tiled"]


@pytest.mark.parametrize(
    "case",
    [
        Case(
            batch=2,
            heads=4,
            kv_heads=2,
            seq_q=72,
            seq_kv=72,
            head_dim=16,
            causal=True,
            mode="fwd_bwd",
            level="layer",
            mask="padding",
        ),
        Case(
            batch=2,
            heads=2,
            kv_heads=2,
            seq_q=40,
            seq_kv=40,
            head_dim=32,
            causal=False,
            mode="fwd_bwd",
            level="layer",
            mask="window",
            pattern="9",
        ),
    ],
    ids=Case.label,
)
def test_layer_level_agrees_and_every_impl_gives_the_same_output(impls, case):
    inputs = make_inputs(case, 0)
    rows = run_rows([impls[name] for name in LAYER_IMPLS], case, settings=FAST)
    outs = {}
    for name in LAYER_IMPLS:
        row = rows[name]
        assert row["status"] == "ok" and row["agrees"] is True, (name, row["reason"])
        outs[name] = Call.prepare(impls[name], case, inputs).check()
    first, *others = outs.values()
    for out, grads in others:  # same weights, same layer: the same numbers, to float32
        torch.testing.assert_close(out, first[0], rtol=1e-4, atol=1e-5)
        for g, g0 in zip(grads, first[1]):
            torch.testing.assert_close(g, g0, rtol=1e-4, atol=1e-4)


def test_layer_reference_matches_autograd_through_a_dense_layer():
    case = Case(
        batch=2,
        heads=4,
        kv_heads=2,
        seq_q=12,
        seq_kv=12,
        head_dim=8,
        causal=True,
        mode="fwd_bwd",
        level="layer",
        mask="padding",
    )
    inputs = make_inputs(case, 1)
    x, *ws = (t.double().requires_grad_() for t in (inputs.x, *inputs.weights))
    q, k, v = (
        F.linear(x, w).unflatten(-1, (h, -1)).transpose(1, 2) for w, h in zip(ws[:3], (4, 2, 2))
    )  # (B, H, S, D)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    keep = torch.ones(12, 12, dtype=torch.bool).tril() & (
        torch.arange(12) < inputs.mask.kv_lens[:, None, None, None]
    )  # (B, 1, S, S)
    s = (q @ k.transpose(-1, -2) * inputs.scale).masked_fill(~keep, float("-inf"))
    want = F.linear((s.softmax(-1) @ v).transpose(1, 2).flatten(2), ws[3])
    want_grads = torch.autograd.grad(want, (x, *ws), inputs.dout.double())
    out, grads = layer_reference(
        inputs.x,
        inputs.weights,
        heads=4,
        kv_heads=2,
        causal=True,
        scale=inputs.scale,
        dout=inputs.dout,
        mask=inputs.mask,
    )
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert len(grads) == 5
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)


def test_tiled_memory_grows_linearly_and_naive_quadratically(impls):
    """Equal steps in N: the growth doubles per doubling of N when memory is linear (a + bN)
    and quadruples when it is quadratic, whatever the constant part."""

    def peak(name, s):
        case = Case(batch=1, heads=2, kv_heads=2, seq_q=s, seq_kv=s, head_dim=32, mode="fwd")
        return peak_mem_mib(
            Call.prepare(impls[name], case, make_inputs(case, 0)).memory_fn(), "cpu"
        )

    def growth_ratio(name):
        p1, p2, p4 = (peak(name, s) for s in (512, 1024, 2048))
        return (p4 - p2) / (p2 - p1)

    assert 3.6 < growth_ratio("naive") < 4.4
    assert 1.8 < growth_ratio("tiled") < 2.2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa", "tiled", "triton_flash", "xformers", "flex"])
def test_layer_level_on_cuda(impls, name):
    case = Case(
        batch=2,
        heads=8,
        kv_heads=2,
        seq_q=512,
        seq_kv=512,
        head_dim=64,
        dtype="bfloat16",
        causal=True,
        mode="fwd_bwd",
        level="layer",
        device="cuda",
    )
    if not impls[name].available:
        pytest.skip(impls[name].unavailable)
    row = run_row(impls[name], case)
    if name == "xformers":  # GQA + backward: said up front, never an error row
        assert row["status"] == "unsupported" and "no backward" in row["reason"]
        return
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]


def test_noisy_samples_and_a_ceiling_below_the_rate_are_said_in_the_reason():
    calls = []

    def jumpy(q, k, v, *, causal, scale):
        calls.append(1)
        time.sleep(0.004 if len(calls) % 2 else 0.0005)  # two speeds: a wide p20-p80
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    impl = registry.Impl(name="jumpy", fn=jumpy)
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16)
    settings = Settings(TimerConfig(rep_ms=40, min_samples=10), matmul_tflops={"float32": 1e-9})
    row = run_row(impl, case, settings=settings)
    assert row["status"] == "ok" and row["agrees"] is True
    assert "noisy: the p20-p80 spread" in row["reason"]
    assert row["pct_peak"] > 100 and "above the measured matmul ceiling" in row["reason"]
