"""transformers' attention functions (impls/hf.py) on the CPU: called the way a model calls them,
with transformers' own mask builders, they agree with the float64 reference; what transformers
cannot express is unsupported with a reason; a sweep puts them next to naive and sdpa."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.cli import main
from attnbench.testing import run_row

pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[hf]')")


def case(**kw) -> Case:
    return Case(**{**dict(batch=2, heads=4, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16), **kw})


CASES = [
    case(causal=True, mode="fwd_bwd"),  # GQA prefill / training
    case(mode="fwd_bwd"),  # an encoder
    case(seq_q=4, seq_kv=96, causal=True, causal_align="bottom_right"),  # decoding 4 tokens
    case(seq_q=1, seq_kv=96, causal=True, causal_align="bottom_right", mask="padding"),
    case(seq_q=16, seq_kv=80),  # cross-attention to an encoder's states
    case(mask="window", pattern="9", causal=True, mode="fwd_bwd"),  # Mistral's sliding window
    case(mask="window", pattern="1"),  # bidirectional: sliding_window W - 1 = 0
    case(mask="window", pattern="9", dtype="bfloat16"),
    case(mask="padding", causal=True, mode="fwd_bwd"),
    case(seq_q=96, seq_kv=96, mask="document", pattern="uniform:10-40", causal=True),
    case(heads=2, kv_heads=2, causal=True, mode="fwd_bwd", level="layer"),
]


@pytest.mark.parametrize(
    "name,c",
    [("hf_sdpa", c) for c in CASES]  # eager: the cases where its float mask differs most
    + [("hf_eager", CASES[i]) for i in (0, 2, 4, 5, 6, 8, 9)],
    ids=lambda x: x.label() if isinstance(x, Case) else x,
)
def test_transformers_attention_agrees_with_the_reference(impls, name, c):
    row = run_row(impls[name], c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]


def test_what_transformers_cannot_express_is_unsupported_with_a_reason(impls):
    eager = impls["hf_eager"]
    assert eager.layout == "bshd"  # q, k, v as the projections make them
    top_left = case(seq_q=1, seq_kv=96, causal=True)
    assert eager.reasons(top_left) == ["causal_align=top_left (supported: bottom_right)"]
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
        "mode=bwd on cpu (supported: fwd; backward on cuda only)"
    ]
    flash = dataclasses.replace(impls["hf_flash2"], unavailable=None)
    cuda = dict(device="cuda", dtype="bfloat16")
    assert flash.reasons(case(**cuda, causal=True, mode="fwd_bwd")) == []
    assert flash.reasons(case(**cuda, mask="padding")) == [
        "mask=padding (supported: none, window, document)"
    ]
    assert flash.reasons(case(dtype="float32")) == [
        "device=cpu (supported: cuda)",
        "dtype=float32 (supported: bfloat16, float16)",
    ]


def test_a_window_convention_off_by_one_disagrees(impls, monkeypatch):
    """The bidirectional builders keep |i - j| <= sliding_window: giving them attnbench's W
    unchanged keeps one key too many on each side, and the reference sees it."""
    from attnbench.impls import hf

    monkeypatch.setattr(hf, "_window", lambda impl, causal, window: window)
    row = run_row(impls["hf_sdpa"], case(mask="window", pattern="9"))
    assert row["status"] == "ok" and row["agrees"] is False


@pytest.mark.slow
def test_flex_through_transformers_agrees_on_the_cpu(impls):
    row = run_row(impls["hf_flex"], case(causal=True, mask="window", pattern="9"))
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


def test_recommendations_name_the_attn_implementation_from_the_hf_rows():
    from synth import ok_row

    from attnbench.report.decide.recommend import recommendations

    def llama(seq_kv):
        return Case(1, 32, 8, 1, seq_kv, 128, causal=True, causal_align="bottom_right",
                    model="llama3-8b", phase="decode")  # fmt: skip

    rows = []
    for seq_kv, (eager, sdpa, flex) in zip((1024, 2048, 4096), ((3, 2, 9), (5, 4, 1), (9, 6, 8))):
        c = llama(seq_kv)
        rows += [ok_row("r", "hf_eager", c, eager, 1), ok_row("r", "hf_sdpa", c, sdpa, 1)]
        rows += [ok_row("r", "hf_flex", c, flex, 1), ok_row("r", "sdpa", c, 0.5, 1)]
    rec = recommendations(pd.DataFrame(rows))
    assert rec.loc[0, "impl"] == "sdpa" and rec.loc[0, "wins"] == 3  # the fastest of all
    # among transformers' functions, sdpa loses least where it loses most (4x at 2048;
    # eager 5x, flex_attention 4.5x)
    assert rec.loc[0, "attn_implementation"] == "sdpa" and rec.loc[0, "attn_worst_loss"] == 4
    without = recommendations(pd.DataFrame([r for r in rows if not r["impl"].startswith("hf")]))
    assert without["attn_implementation"].isna().all()


@pytest.mark.slow
def test_a_llama_report_names_the_attn_implementation_to_use(tmp_path):
    argv = ["sweep", "--model", "llama3-8b", "--phase", "prefill,decode", "--heads", "4"]
    argv += ["--kv-heads", "2", "--head-dim", "16", "--seq-len", "64", "--seq-len-kv", "128"]
    argv += ["--batch", "1", "--impls", "sdpa,hf_eager,hf_sdpa", "--rep-ms", "2"]
    argv += ["--no-isolate", "--no-progress", "--run-id", "llama"]
    argv += ["--results-dir", str(tmp_path / "results"), "--reports-dir", str(tmp_path / "rep")]
    assert main(argv) == 0
    df = pd.read_csv(tmp_path / "results" / "llama" / "results.csv")
    assert (df["status"] == "ok").all() and df["agrees"].all()
    report = (tmp_path / "rep" / "llama" / "report.md").read_text()
    section = report.split("## Recommendations")[1].split("\n## ")[0]
    assert "the `attn_implementation` to set" in section
    for phase in ("prefill", "decode"):
        line = next(x for x in section.splitlines() if x.startswith(f"| llama3-8b | {phase} |"))
        assert "`eager` (" in line or "`sdpa` (" in line, line
