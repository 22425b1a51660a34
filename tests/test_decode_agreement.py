"""Single-query decode over long caches in float32 (one query row, thousands of keys): the
P V sum's rounding grows like the square root of the number of keys, and the agreement rule's
bound with it (docs/method.md), so the correct impls agree at 4k, 8k and 16k keys over
several seeds, and a 0.1% scale error is still caught. The verdict is the harness's own
(run.row.ground_truth, run.call.Call, measure.agreement.judge). The Llama-3-8B-sized version
is slow."""

import sys
from pathlib import Path

import pytest
import torch.nn.functional as F

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import agreement
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth

IMPLS = ("sdpa", "naive", "tiled")
BUILTIN = plugins.discover(entry_points=False)


def decode(heads, kv_heads, seq_kv, head_dim):
    return Case(
        batch=1,
        heads=heads,
        kv_heads=kv_heads,
        seq_q=1,
        seq_kv=seq_kv,
        head_dim=head_dim,
        causal=True,
        causal_align="bottom_right",
        mode="fwd",
    )


def verdicts(case, seeds):
    """{(impl, seed): Verdict} of the correct impls, and of sdpa with its scale off by 0.1%."""
    out = {}
    for seed in seeds:
        inputs = make_inputs(case, seed)
        truth = ground_truth(case, inputs)

        def judge(x, truth=truth):
            return agreement.judge(case, [x], truth)

        for name in IMPLS:
            got, _ = Call.prepare(BUILTIN[name], case, inputs).check()
            out[name, seed] = judge(got)
        q, k, v = inputs.q, inputs.k, inputs.v
        off = F.scaled_dot_product_attention(q, k, v, scale=inputs.scale * 1.001, enable_gqa=True)
        out["scale_x1.001", seed] = judge(off)
    return out


def check(case, seeds):
    got = verdicts(case, seeds)
    alarms = {k: v.notes for k, v in got.items() if k[0] in IMPLS and not v.agrees}
    assert not alarms, alarms
    missed = [k for k, v in got.items() if k[0] == "scale_x1.001" and v.agrees]
    assert not missed, missed
    shares = [v.errors[0].norm_share for k, v in got.items() if k[0] in IMPLS]
    assert 0 < max(shares) < 1  # the bound is not so loose that it says nothing


@pytest.mark.parametrize("seq_kv", [4096, 8192, 16384])
def test_float32_single_query_decode_has_no_false_alarm(seq_kv):
    check(decode(4, 1, seq_kv, 64), seeds=range(3))


@pytest.mark.slow
@pytest.mark.parametrize("seq_kv", [4096, 8192, 16384, 32768])
def test_float32_single_query_decode_has_no_false_alarm_llama3_8b(seq_kv):
    check(decode(32, 8, seq_kv, 128), seeds=range(5))


@pytest.mark.slow
def test_the_bound_grows_at_least_like_the_measured_error():
    """scripts/calibrate_accuracy.py's growth check on 1k-16k keys: the worst correct error of
    out grows like keys^0.5, and so does the bound's long-sum part (the bound's constant part
    dominates at a few thousand keys, so the whole bound grows slower there)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    calibrate = pytest.importorskip("calibrate_accuracy")
    shapes = [calibrate.Shape(1, 4, 1, 1, n, 64, True, align="bottom_right", mode="fwd")
              for n in (1024, 4096, 16384)]  # fmt: skip
    df = calibrate.population(shapes, 2, ["float32"], "cpu", progress=False)
    _, exps = calibrate.growth(df[~df.bug])
    worst, bound, long_sums = exps["float32"]
    assert 0.35 < worst < 0.65 and abs(long_sums - worst) < 0.15 and 0 < bound < long_sums
