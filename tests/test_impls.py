"""Every impl that runs on the CPU against the float64 reference, through the sweep's own
measure() so the agreement rule under test is the one the CSV uses."""
import itertools
import textwrap

import pytest

from attnbench import registry
from attnbench.case import Case
from attnbench.inputs import make_inputs
from attnbench.memory import peak_mem_mib
from attnbench.runner import Call
from attnbench.sweep import ground_truth, measure
from attnbench.timing import TimerConfig

FAST = TimerConfig(rep_ms=1.0, min_samples=1)
SHAPES = [  # (heads, kv_heads, seq_q, seq_kv, head_dim)
    (2, 2, 64, 64, 32),
    (4, 2, 80, 48, 16),  # GQA, seq_q > seq_kv
    (4, 1, 40, 100, 64),  # MQA, seq_q < seq_kv
    (2, 2, 300, 300, 16),  # several tiles, ragged last one
]


def run(impl, case, seed=0):
    inputs = make_inputs(case, seed)
    row, _ = measure(impl, case, inputs, ground_truth(case, inputs), FAST)
    return row


def cases(dtypes=("float32",)):
    for (h, hkv, sq, skv, d), causal, mode, dtype in itertools.product(
            SHAPES, (False, True), ("fwd", "fwd_bwd"), dtypes):
        yield Case(batch=2, heads=h, kv_heads=hkv, seq_q=sq, seq_kv=skv, head_dim=d,
                   causal=causal, mode=mode, dtype=dtype)


@pytest.mark.parametrize("name", ["naive", "sdpa", "tiled"])
@pytest.mark.parametrize("case", list(cases()), ids=Case.label)
def test_impl_agrees_with_reference(impls, name, case):
    row = run(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert row["rel_err"] <= row["err_bound"]
    assert row["time_ms"] > 0 and row["peak_mem_mib"] >= 0


@pytest.mark.parametrize("name", ["sdpa", "tiled"])
@pytest.mark.parametrize("case", [c for c in cases(("bfloat16",)) if c.seq_q <= 80],
                         ids=Case.label)
def test_impl_agrees_in_bfloat16(impls, name, case):
    row = run(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]


WRONG = {
    # bottom-right causal alignment instead of top-left: only differs when seq_q != seq_kv
    "wrong_align": "s.masked_fill(j > i + (s.shape[-1] - s.shape[-2]), float('-inf'))",
    # off-by-one diagonal: each query also sees the next key
    "wrong_diag": "s.masked_fill(j > i + 1, float('-inf'))",
}


@pytest.mark.parametrize("bug", sorted(WRONG))
def test_agreement_rule_catches_a_wrong_impl(tmp_path, bug):
    path = tmp_path / f"{bug}.py"
    path.write_text(textwrap.dedent(f"""
        import torch
        from attnbench.registry import register

        @register("{bug}")
        def impl(q, k, v, *, causal, scale):
            s = q @ k.transpose(-1, -2) * scale
            if causal:
                i = torch.arange(s.shape[-2])[:, None]
                j = torch.arange(s.shape[-1])[None, :]
                s = {WRONG[bug]}
            return s.softmax(-1) @ v
    """))
    impl = registry.discover([str(path)], builtin=False, entry_points=False)[bug]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=96, head_dim=32, causal=True)
    row = run(impl, case)
    assert row["status"] == "ok"
    assert row["agrees"] is False
    assert "disagrees with the float64 reference in out" in row["reason"]
    assert row["rel_err"] > row["err_bound"]


def test_tiled_memory_grows_linearly_and_naive_quadratically(impls):
    """Equal steps in N: the growth doubles per doubling of N when memory is linear (a + bN)
    and quadruples when it is quadratic, whatever the constant part."""
    def peak(name, s):
        case = Case(batch=1, heads=2, kv_heads=2, seq_q=s, seq_kv=s, head_dim=32, mode="fwd")
        return peak_mem_mib(Call.prepare(impls[name], case, make_inputs(case, 0)).memory_fn(),
                            "cpu")

    def growth_ratio(name):
        p1, p2, p4 = (peak(name, s) for s in (512, 1024, 2048))
        return (p4 - p2) / (p2 - p1)
    assert 3.6 < growth_ratio("naive") < 4.4
    assert 1.8 < growth_ratio("tiled") < 2.2
