"""Presets expand into the cases they promise; the console summary covers the whole run."""

import pandas as pd

from attnbench.cli import summary_table
from attnbench.spec import PRESETS, Spec


def test_race_preset_holds_tokens_and_hidden_size_fixed():
    cases = Spec.from_preset("race", "cuda").cases()
    assert len(cases) == 6 * 2 * 2 * 2
    for c in cases:
        assert c.batch * c.seq_q == 16384 and c.heads * c.head_dim == 2048
        assert c.dtype == "bfloat16" and c.heads == c.kv_heads
    assert PRESETS["race"]["impls"][0] == "triton_flash"


def test_gpu_presets_name_their_impls_and_leave_out_the_slow_ones():
    for name in ("gpu", "first-light"):
        impls = PRESETS[name]["impls"]
        assert "sdpa" in impls and "triton_flash" in impls
        assert not {"flex", "naive_compiled", "tiled"} & set(impls)
    assert len(Spec.from_preset("first-light", "cuda").cases()) == 12


def test_summary_leaves_out_impls_that_never_ran_and_names_them():
    base = dict(
        mode="fwd",
        dtype="float32",
        causal=False,
        mask="none",
        window=pd.NA,
        level="op",
        batch=1,
        heads=2,
        kv_heads=2,
        seq_q=64,
        seq_kv=64,
        head_dim=16,
        device="cpu",
    )
    df = pd.DataFrame(
        [
            {**base, "impl": "naive", "status": "ok", "time_ms": 1.5, "agrees": True},
            {**base, "impl": "sdpa", "status": "ok", "time_ms": 0.5, "agrees": False},
            {
                **base,
                "impl": "xformers",
                "status": "unsupported",
                "time_ms": pd.NA,
                "agrees": pd.NA,
            },
        ]
    )
    text = summary_table(df, ["naive", "sdpa", "xformers"])
    assert "1.5" in text and "0.5 !" in text
    assert "unsupported in every case (reasons in the report): xformers" in text
    table = text.split("\n")[1]
    assert "xformers" not in table


def test_explicit_batch_and_heads_win_over_the_race_presets_fixed_sizes():
    cases = Spec.from_preset("race", "cpu", batch=[1], heads=[2], seq_len=[32]).cases()
    assert {(c.batch, c.heads) for c in cases} == {(1, 2)}


def test_bottom_right_alignment_with_nothing_to_align_is_refused(tmp_path, capsys):
    import pytest

    from attnbench.case import CaseError
    from attnbench.cli import main

    spec = Spec.from_preset("smoke", "cpu", causal=[False], causal_align=["bottom_right"])
    with pytest.raises(CaseError, match="no case of this grid is causal or has a mask it places"):
        spec.cases()
    args = ["sweep", "--device", "cpu", "--preset", "smoke", "--causal", "false"]
    args += ["--causal-align", "bottom_right", "--results-dir", str(tmp_path / "res")]
    assert main(args) == 2
    assert "--causal-align bottom_right: no case" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()
    # with causal both, the causal cases take it and the others stay top-left (docs/method.md)
    both = Spec.from_preset("smoke", "cpu", causal_align=["bottom_right"]).cases()
    aligns = {(c.causal, c.causal_align) for c in both}
    assert aligns == {(True, "bottom_right"), (False, "top_left")}


def test_decode_is_causal_with_or_without_a_model():
    import pytest

    from attnbench.case import CaseError

    decode = Spec.from_preset("cpu", "cpu", phase=["decode"]).cases()  # the preset: causal both
    assert decode and all(c.causal and c.causal_align == "bottom_right" for c in decode)
    mixed = Spec.from_preset("cpu", "cpu", phase=["prefill", "decode"], causal=[False, True])
    phases = {(c.phase, c.causal) for c in mixed.cases()}
    assert phases == {("prefill", False), ("prefill", True), ("decode", True)}
    with pytest.raises(CaseError, match="--phase decode is causal"):
        Spec.from_preset("cpu", "cpu", phase=["decode"], causal=[False]).cases()


def test_an_impl_that_fits_no_case_is_said_before_the_sweep_with_the_flag_that_fits_it():
    from types import SimpleNamespace

    from attnbench.case import Case
    from attnbench.run.planning.selection import unfit_lines

    cases = [Case(1, 4, 4, n, n, 64) for n in (32, 64)]  # float32
    half = SimpleNamespace(
        name="my_attn", reasons=lambda c: ["dtype=float32 (supported: float16, bfloat16)"]
    )
    fits = SimpleNamespace(name="sdpa", reasons=lambda c: [])
    assert unfit_lines([half, fits], cases) == [
        "my_attn fits no case of this grid (dtype=float32 (supported: float16, bfloat16)): "
        "its rows will be unsupported; --dtype float16 makes cases it takes"
    ]
    assert unfit_lines([fits], cases) == []
