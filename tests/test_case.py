import dataclasses

import pytest
import torch

from attnbench.case import Case, CaseError, causal_pairs


def case(**kw):
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16)
    return Case(**{**base, **kw})


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("batch", 0, "batch=0 must be a positive integer"),
        ("seq_q", -3, "seq_q=-3 must be a positive integer"),
        ("head_dim", 1.5, "head_dim=1.5 must be a positive integer"),
        ("kv_heads", 3, "heads=4 must be a multiple of kv_heads=3"),
        ("dtype", "float64", "unknown dtype 'float64'"),
        ("mode", "forward", "unknown mode 'forward'"),
        ("device", "tpu", "unknown device 'tpu'"),
    ],
)
def test_validation_names_the_problem(field, value, message):
    with pytest.raises(CaseError, match=message.replace("(", r"\(")):
        case(**{field: value})


def test_dtype_short_forms():
    assert case(dtype="bf16").dtype == "bfloat16"
    assert case(dtype="fp16").torch_dtype is torch.float16


@pytest.mark.parametrize("sq,skv", [(1, 1), (5, 5), (7, 3), (3, 7), (128, 64), (64, 200)])
def test_causal_pairs_match_the_top_left_mask(sq, skv):
    mask = torch.ones(sq, skv, dtype=torch.bool).tril()  # SDPA's is_causal mask
    assert causal_pairs(sq, skv) == int(mask.sum())


def test_flops_follow_the_design_rules():
    c = case(seq_q=6, seq_kv=4, causal=False)
    fwd = 4 * 2 * 4 * 6 * 4 * 16
    assert c.flops() == fwd
    assert case(seq_q=6, seq_kv=4, mode="bwd").flops() == 2.5 * fwd
    assert case(seq_q=6, seq_kv=4, mode="fwd_bwd").flops() == 3.5 * fwd
    causal = case(seq_q=6, seq_kv=4, causal=True)
    assert causal.flops() == 4 * 2 * 4 * (1 + 2 + 3 + 4 + 4 + 4) * 16


def test_case_is_frozen_and_hashable():
    c = case()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batch = 3
    assert len({c, case()}) == 1
