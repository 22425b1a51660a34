"""torch.compile impls (flex, naive_compiled): agreement under every mask, compile_ms outside
time_ms, recompiles inside the timed region caught, and the eager form the diagnosis runs.
Compiling on the CPU takes seconds per graph: the cases share shapes so that few graphs are
compiled. The key length is not a multiple of FlexAttention's 128-wide blocks, so its last
block is partial."""

import textwrap

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure.compiling import Watch, compile_events, eagerly
from attnbench.measure.timing import TimerConfig
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import Settings
from attnbench.testing import run_row

SHAPE = dict(batch=2, heads=4, kv_heads=2, seq_q=80, seq_kv=72, head_dim=16)
MASKS = [
    dict(causal=False),
    dict(causal=True),
    dict(mask="padding"),
    dict(mask="window", pattern="12", causal=True),
    dict(mask="window", pattern="12"),
]


def label(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.slow
@pytest.mark.parametrize("kw", MASKS, ids=label)
def test_flex_forward_agrees_under_every_mask_or_blames_the_compiler(impls, kw):
    """Its eager form agrees under every mask; compiled, torch's CPU FlexAttention is wrong at
    some shapes on some CPUs (docs/method.md, "Third-party bugs found"), and the row then
    says so, by the same rule, instead of agreeing."""
    row = run_row(impls["flex"], Case(**SHAPE, **kw))
    assert row["status"] == "ok", row["reason"]
    compiler = "eager agrees: the compiled output is wrong (torch.compile"
    assert row["agrees"] is True or compiler in row["reason"], row["reason"]
    assert row["recompiled"] is False
    assert row["compile_ms"] >= 0


def test_flex_has_no_cpu_backward(impls):
    row = run_row(impls["flex"], Case(**SHAPE, mode="fwd_bwd"))
    assert row["status"] == "unsupported"
    assert row["reason"] == "mode=fwd_bwd on cpu (supported: fwd; backward on cuda only)"


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw", [dict(mask="padding", causal=True), dict(mask="window", pattern="12")], ids=label
)
def test_naive_compiled_agrees_with_grads(impls, kw):
    row = run_row(impls["naive_compiled"], Case(**SHAPE, mode="fwd_bwd", **kw))
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert row["recompiled"] is False


@pytest.mark.slow
def test_compile_ms_is_the_first_calls_extra_time_and_not_in_time_ms(impls):
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=24, seq_kv=24, head_dim=8)  # a new graph
    events = compile_events()
    first = run_row(impls["naive_compiled"], case)
    assert compile_events() > events  # it compiled: compile_ms is that call's extra time
    assert first["status"] == "ok" and first["recompiled"] is False
    assert first["compile_ms"] > 0
    again = run_row(impls["naive_compiled"], case)  # the compiled graph is reused
    assert again["compile_ms"] == 0.0
    assert "the first call compiled nothing" in again["reason"]
    assert again["recompiled"] is False


@pytest.mark.slow
def test_the_eager_form_compiles_nothing_and_leaves_the_compiled_code(impls):
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=24, seq_kv=24, head_dim=8)
    call = Call.prepare(impls["naive_compiled"], case, make_inputs(case, 0))
    compiled, _ = call.check()
    with Watch() as eager_run:
        eager, _ = eagerly(call.check)()
    with Watch() as compiled_again:
        call.check()
    assert not eager_run.compiled and not compiled_again.compiled
    assert torch.allclose(eager, compiled, rtol=1e-4, atol=1e-5)


RECOMPILING = """
import itertools

import torch
import torch.nn.functional as F
from attnbench.registry import register

calls = itertools.count()


# a recompile is dynamo's, whatever backend then builds the graph: "eager" builds no C++
@torch.compile(dynamic=False, backend="eager")
def doubled(x):
    return x * 2.0


@register("recompiling", compiled=True, backward=False)
def recompiling(q, k, v, *, causal, scale):
    # calls 0 and 1 are the checked call and the steady one, then 2 to 8 warm-up calls
    # (timing.CPU_WARMUP_MAX_CALLS); from call 10 on (in the first round's samples, which
    # take many calls) the input has a new shape, so the function is compiled again there
    x = q if next(calls) < 10 else q[..., :1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) + 0 * doubled(
        x).sum()
"""


def test_a_recompile_inside_the_timing_pass_is_flagged(tmp_path):
    path = tmp_path / "recompiling.py"
    path.write_text(textwrap.dedent(RECOMPILING))
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["recompiling"]
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=8)
    settings = Settings(TimerConfig(rep_ms=100.0, min_samples=1))  # rounds of many calls
    row = run_row(impl, case, settings=settings)
    assert row["status"] == "ok", row["reason"]
    assert row["compile_ms"] > 0
    assert row["recompiled"] is True
    assert "recompiled during the timing pass" in row["reason"]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", MASKS, ids=label)
def test_flex_forward_and_backward_agree_on_cuda(impls, kw):
    case = Case(
        **{**SHAPE, "seq_q": 256, "seq_kv": 256, "head_dim": 64},
        dtype="bfloat16",
        device="cuda",
        mode="fwd_bwd",
        **kw,
    )
    row = run_row(impls["flex"], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert row["recompiled"] is False
