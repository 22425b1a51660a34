"""transformers' attention functions (impls/hf.py) on the CPU: called the way a model calls them,
with transformers' own mask builders, they agree with the float64 reference; what transformers
cannot express is unsupported with a reason; a sweep puts them next to naive and sdpa."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.cli import main
from attnbench.measure.timing import TimerConfig
from attnbench.run.inputs import make_inputs
from attnbench.run.row import Settings, ground_truth, measure

pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")

FAST = Settings(TimerConfig(rep_ms=1.0, min_samples=1))
HF_CPU = ["hf_eager", "hf_sdpa"]


def case(**kw) -> Case:
    return Case(**{**dict(batch=2, heads=4, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16), **kw})


CASES = [
    case(causal=True, mode="fwd_bwd"),  # GQA prefill / training
    case(mode="fwd_bwd"),  # an encoder
    case(seq_q=4, seq_kv=96, causal=True, causal_align="bottom_right"),  # decoding 4 tokens
    case(seq_q=1, seq_kv=96, causal=True, causal_align="bottom_right", mask="padding"),
    case(seq_q=16, seq_kv=80),  # cross-attention to an encoder's states
    case(mask="window", window=9, causal=True, mode="fwd_bwd"),  # Mistral's sliding window
    case(mask="window", window=1),  # bidirectional: sliding_window W - 1 = 0
    case(mask="window", window=9, dtype="bfloat16"),
    case(mask="padding", causal=True, mode="fwd_bwd"),
    case(seq_q=96, seq_kv=96, mask="document", pattern="uniform:10-40", causal=True),
    case(heads=2, kv_heads=2, causal=True, mode="fwd_bwd", level="layer"),
]


def run(impl, c: Case) -> dict:
    inputs = make_inputs(c, 0)
    return measure(impl, c, inputs, ground_truth(c, inputs), FAST).row


@pytest.mark.parametrize("name", HF_CPU)
@pytest.mark.parametrize("c", CASES, ids=Case.label)
def test_transformers_attention_agrees_with_the_reference(impls, name, c):
    row = run(impls[name], c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]


def test_what_transformers_cannot_express_is_unsupported_with_a_reason(impls):
    eager = impls["hf_eager"]
    assert eager.layout == "bshd"  # q, k, v as the projections make them
    top_left = case(seq_q=1, seq_kv=96, causal=True)
    assert eager.reasons(top_left) == [
        "causal_align=top_left with seq_q=1 != seq_kv=96 (supported: bottom_right; a "
        "transformers model's new tokens follow its cache)"
    ]
    assert (
        "seq_q=80 > seq_kv=48 with causal_align=bottom_right"
        in (eager.reasons(case(seq_q=80, seq_kv=48, causal=True, causal_align="bottom_right"))[0])
    )
    assert eager.reasons(case(mask="document", pattern="fixed:16"))[0].startswith(
        "mask=document with causal=False (supported: causal"
    )
    assert eager.reasons(case(mask="block_sparse", pattern="block=16"))[0].startswith(
        "mask=block_sparse (supported: none, padding, window, document)"
    )
    assert impls["hf_flex"].reasons(case(mode="bwd")) == [
        "mode=bwd on cpu (supported: fwd; FlexAttention has no CPU backward)"
    ]
    flash = dataclasses.replace(impls["hf_flash2"], unavailable=None)
    cuda = dict(device="cuda", dtype="bfloat16")
    assert flash.reasons(case(**cuda, causal=True, mode="fwd_bwd")) == []
    assert flash.reasons(case(**cuda, mask="padding"))[0].startswith(
        "mask=padding (supported: none, window, document; transformers' flash path drops"
    )
    assert flash.reasons(case(dtype="float32")) == [
        "device=cpu (supported: cuda)",
        "dtype=float32 (supported: bfloat16, float16)",
    ]


def test_a_window_convention_off_by_one_disagrees(impls, monkeypatch):
    """The bidirectional builders keep |i - j| <= sliding_window: giving them attnbench's W
    unchanged keeps one key too many on each side, and the reference sees it."""
    from attnbench.impls import hf

    monkeypatch.setattr(hf, "_window", lambda impl, causal, window: window)
    row = run(impls["hf_sdpa"], case(mask="window", window=9))
    assert row["status"] == "ok" and row["agrees"] is False


@pytest.mark.slow
def test_flex_through_transformers_agrees_on_the_cpu(impls):
    row = run(impls["hf_flex"], case(causal=True, mask="window", window=9))
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert row["compile_ms"] is not None


@pytest.mark.slow
def test_a_sweep_puts_transformers_next_to_naive_and_sdpa(tmp_path):
    """fwd and bwd, causal both, GQA, windows: every row ok and agreeing, except hf_flex's
    backward rows, which FlexAttention does not have on the CPU."""
    impls = "naive,sdpa,hf_eager,hf_sdpa,hf_flex"
    argv = ["sweep", "--impls", impls, "--batch", "1", "--heads", "4", "--kv-heads", "2"]
    argv += ["--seq-len", "64", "--head-dim", "16", "--causal", "both", "--mode", "fwd,bwd"]
    argv += ["--mask", "none,window", "--window", "16", "--rep-ms", "2", "--no-isolate"]
    argv += ["--run-id", "hf", "--results-dir", str(tmp_path), "--no-report", "--no-progress"]
    assert main(argv) == 0
    df = pd.read_csv(tmp_path / "hf" / "results.csv")
    assert len(df) == 8 * 5
    flex_bwd = (df["impl"] == "hf_flex") & (df["mode"] == "bwd")
    assert (df[flex_bwd]["status"] == "unsupported").all()
    rest = df[~flex_bwd]
    assert (rest["status"] == "ok").all(), rest[rest["status"] != "ok"][["impl", "reason"]]
    assert rest["agrees"].all()
