"""Masks as a case dimension: the rules, written once more here as plain Python loops, against
the reference, the FLOP count, the impl-side helpers, the Case and the grid."""

import math

import pytest
import torch

from attnbench.case import Case, CaseError
from attnbench.masks import Mask, block_keep
from attnbench.masks.interval import Interval
from attnbench.measure import reference
from attnbench.run.measuring.inputs import make_inputs
from attnbench.spec import Spec

RULES = [  # (causal, window, padded)
    (False, None, False),
    (True, None, False),
    (False, None, True),
    (True, None, True),
    (False, 3, False),
    (True, 3, False),
    (False, 1, False),
    (True, 1, False),
]


def loop_keep(b, i, j, *, causal, window, kv_lens):
    """README's mask rules, one (batch, query, key) at a time."""
    if causal and j > i:
        return False
    if window is not None and (i - j >= window if causal else abs(i - j) >= window):
        return False
    return kv_lens is None or j < kv_lens[b]


def loop_mask(B, Sq, Skv, **rule):
    return torch.tensor(
        [[[loop_keep(b, i, j, **rule) for j in range(Skv)] for i in range(Sq)] for b in range(B)]
    )  # (B, Sq, Skv)


def rule_args(causal, window, padded, B=3, Skv=7):
    kv_lens = [5, 1, 7][:B] if padded else None
    return dict(causal=causal, window=window, kv_lens=kv_lens)


def interval(sq, skv, rule, B=3) -> Interval:
    lens = None if rule["kv_lens"] is None else torch.tensor(rule["kv_lens"])
    return Interval(sq, skv, B, 0, window=rule["window"], kv_lens=lens)


@pytest.mark.parametrize("sq,skv", [(7, 7), (9, 7), (5, 7)])
@pytest.mark.parametrize("causal,window,padded", RULES)
def test_block_keep_and_pair_count_follow_the_rules(sq, skv, causal, window, padded):
    rule = rule_args(causal, window, padded)
    want = loop_mask(3, sq, skv, **rule)
    lens = None if rule["kv_lens"] is None else torch.tensor(rule["kv_lens"])
    got = block_keep(0, sq, 0, skv, skv, causal=causal, window=window, kv_lens=lens)
    assert torch.equal(got.expand_as(want), want)
    if window is not None and sq > skv + window - 1:
        return  # such a case is refused (rows without keys); see the validation test
    layout = interval(sq, skv, rule)
    assert torch.equal(layout.dense(causal, "cpu")[:, 0].expand_as(want), want)
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    assert torch.equal(~layout.hidden(i, j, causal).expand_as(want), want)  # written apart
    mask = "window" if window else "padding" if padded else "none"
    spec = str(window) if window else None
    case = Case(3, 2, 2, sq, skv, 4, causal=causal, mask=mask, pattern=spec)
    assert case.pairs(layout) == int(want.sum())
    assert case.flops(layout) == 4 * 2 * int(want.sum()) * 4


@pytest.mark.parametrize("causal,window,padded", RULES)
def test_reference_applies_the_rules(monkeypatch, causal, window, padded):
    monkeypatch.setattr(reference, "CHUNK_BYTES", 3 * 8 * 2 * 7)  # 3 query rows per chunk
    rule = rule_args(causal, window, padded)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (
        torch.randn(3, 2, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
        for _ in range(4)
    )
    mask = Mask("window", interval(7, 7, rule))
    out, grads = reference.reference(
        q, k, v, causal=causal, scale=0.5, dout=dout.detach(), mask=mask
    )
    keep = loop_mask(3, 7, 7, **rule)[:, None]  # (B, 1, Sq, Skv)
    want = ((q @ k.transpose(-1, -2)) * 0.5).masked_fill(~keep, -math.inf).softmax(-1) @ v
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for got, exp in zip(grads, torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)


def test_key_lengths_are_seeded_in_range_and_leave_q_k_v_alone():
    case = Case(batch=8, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=4, mask="padding")

    def key_lengths(c, seed):
        lens = c.kind.layout(c, seed).kv_lens
        return None if lens is None else lens.tolist()

    lens = key_lengths(case, 3)
    assert lens == key_lengths(case, 3) and lens != key_lengths(case, 4)
    assert all(1 <= n <= 16 for n in lens)
    assert (
        key_lengths(Case(batch=8, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=4), 3) is None
    )
    padded, plain = (
        make_inputs(case, 3),
        make_inputs(Case(batch=8, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=4), 3),
    )
    assert torch.equal(padded.q, plain.q) and plain.mask.kv_lens is None
    assert padded.mask.kv_lens.tolist() == lens


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(mask="diagonal"), "unknown mask 'diagonal'"),
        (dict(mask="window"), "mask=window: --window needs the window width W"),
        (dict(mask="window", pattern="0"), "needs the window width W, a positive integer"),
        (dict(pattern="4"), "pattern='4' needs mask"),
        (dict(mask="window", pattern="4", seq_q=20, seq_kv=8), "would see no key"),
        (dict(level="block"), "unknown level 'block'"),
        (dict(level="layer", seq_q=8, seq_kv=12), "level=layer is self-attention"),
    ],
)
def test_case_validation_of_mask_window_level(kw, message):
    base = dict(batch=1, heads=2, kv_heads=2, seq_q=8, seq_kv=8, head_dim=4)
    with pytest.raises(CaseError, match=message):
        Case(**{**base, **kw})


def test_layer_flops_add_the_four_projections():
    case = Case(batch=2, heads=4, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16, level="layer")
    attn = 4 * 2 * 4 * 8 * 8 * 16
    proj = 2 * 2 * 8 * 64 * (64 + 32 + 32 + 64)  # q, k, v, out: 2·B·S·d_in·d_out each
    assert case.flops() == attn + proj
    bwd = Case(**{**case.as_dict(), "mode": "fwd_bwd"})
    assert bwd.flops() == 3.5 * attn + 3 * proj


def test_grid_mask_causal_shorthand_and_windows():
    spec = Spec.from_preset(
        "smoke",
        "cpu",
        seq_len=[64],
        mode=["fwd"],
        mask=["none", "causal", "padding", "window"],
        window=[8, 16],
    )
    combos = [(c.mask, c.causal, c.pattern) for c in spec.cases()]
    assert combos == [
        ("none", False, None),
        ("none", True, None),
        ("padding", False, None),
        ("padding", True, None),
        ("window", False, "8"),
        ("window", False, "16"),
        ("window", True, "8"),
        ("window", True, "16"),
    ]
    spelled = Spec.from_preset("smoke", "cpu", seq_len=[64], mode=["fwd"], mask=["window:8"])
    assert [(c.mask, c.pattern) for c in spelled.cases()] == [("window", "8")] * 2
    only_causal = Spec.from_preset("smoke", "cpu", seq_len=[64], mode=["fwd"], mask=["causal"])
    assert [(c.mask, c.causal) for c in only_causal.cases()] == [("none", True)]
    with pytest.raises(CaseError, match="needs its spec: give --window or --mask window:SPEC"):
        Spec.from_preset("smoke", "cpu", mask=["window"]).cases()


def test_level_is_part_of_the_grid_and_the_label():
    spec = Spec.from_preset(
        "smoke", "cpu", seq_len=[64], mode=["fwd"], causal=[False], level=["op", "layer"]
    )
    cases = spec.cases()
    assert [c.level for c in cases] == ["op", "layer"]
    assert cases[1].label().endswith("fwd layer") and "layer" not in cases[0].label()
