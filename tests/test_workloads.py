"""Real workloads: bottom-right causal, model presets, phases, decode with a KV cache (paged
too), bytes moved and the roofline, recommendations in the report."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from sweeps import sweep  # scripts/sweep.py --device cpu in a subprocess
from torchlog import own_lines

from attnbench.case import Case, CaseError
from attnbench.cli import main
from attnbench.masks import Mask
from attnbench.measure.reference import reference
from attnbench.measure.roofline import roofline
from attnbench.measure.timing import TimerConfig
from attnbench.models import MODELS, model
from attnbench.registry import Impl
from attnbench.run.measuring.inputs import make_inputs, paged
from attnbench.run.measuring.row import Settings
from attnbench.spec import DECODE_BATCH, DECODE_TOKENS, Spec
from attnbench.store.results import read_results
from attnbench.testing import run_row, run_rows

QUICK = Settings(timer=TimerConfig(rep_ms=2.0))


def by_elements(q, k, v, shift):
    """Bottom-right causal attention, one query and one key at a time, in float64: query i
    sees key j when j <= i + shift; a query that sees no key gives zeros."""
    B, H, Sq, D = q.shape
    group = H // k.shape[1]
    out = torch.zeros(B, H, Sq, D, dtype=torch.float64)
    for b, h, i in itertools.product(range(B), range(H), range(Sq)):
        keys = [j for j in range(k.shape[2]) if j <= i + shift]
        if not keys:
            continue
        kv = h // group
        s = torch.stack([q[b, h, i].double() @ k[b, kv, j].double() * 0.3 for j in keys])
        p = torch.exp(s - s.max())
        p = p / p.sum()
        out[b, h, i] = sum(p[n] * v[b, kv, j].double() for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("Sq,Skv", [(3, 7), (7, 3), (1, 6), (5, 5)])
def test_reference_bottom_right_follows_the_element_rule(Sq, Skv):
    gen = torch.Generator().manual_seed(Sq * 10 + Skv)
    q = torch.randn(2, 4, Sq, 8, generator=gen)
    k, v = (torch.randn(2, 2, Skv, 8, generator=gen) for _ in range(2))
    dout = torch.randn(2, 4, Sq, 8, generator=gen)
    mask = Mask(align="bottom_right")  # query i at position i + Skv - Sq
    out, (dq, dk, dv) = reference(q, k, v, causal=True, scale=0.3, dout=dout, mask=mask)
    assert torch.allclose(out, by_elements(q, k, v, Skv - Sq), atol=1e-12)
    if Sq > Skv:  # the first Sq - Skv queries see no key: zero output, zero gradient
        assert out[:, :, : Sq - Skv].abs().max() == 0
        assert dq[:, :, : Sq - Skv].abs().max() == 0
    for t in (dq, dk, dv):
        assert torch.isfinite(t).all()


def test_case_pairs_and_flops_of_decode_rows_match_hand_counts():
    # Sq = 4 new tokens against a 1024 cache, bottom-right: they see 1021, 1022, 1023, 1024 keys
    c = Case(8, 32, 8, 4, 1024, 128, "bfloat16", causal=True, causal_align="bottom_right")
    assert c.pairs() == 8 * (1021 + 1022 + 1023 + 1024)
    assert c.flops() == 4 * 32 * 8 * (1021 + 1022 + 1023 + 1024) * 128
    # bytes: q and out (8*32*4*128 each), k and v (8*8*1024*128 each), 2 bytes apiece
    assert c.bytes_moved() == 2 * (2 * 8 * 32 * 4 * 128 + 2 * 8 * 8 * 1024 * 128)
    # top-left, the same 4 queries see 1, 2, 3, 4 keys
    top = Case(8, 32, 8, 4, 1024, 128, "bfloat16", causal=True)
    assert top.pairs() == 8 * 10
    # Sq > Skv bottom-right: queries 0..2 see nothing, then 1..3 keys
    assert Case(1, 1, 1, 6, 3, 8, causal=True, causal_align="bottom_right").pairs() == 6
    fwd_bwd = Case(1, 2, 1, 4, 8, 16, causal=True, mode="fwd_bwd")
    # read q, k, v, dout; write out, dq, dk, dv: 2 x (q + k + v) + 2 x q elements
    q, kv = 2 * 4 * 16, 2 * 8 * 16
    assert fwd_bwd.bytes_moved() == 4 * (2 * (q + kv) + 2 * q)


def test_alignment_needs_a_causal_or_window_mask():
    with pytest.raises(CaseError, match="causal_align=bottom_right"):
        Case(1, 1, 1, 4, 8, 16, causal=False, causal_align="bottom_right")
    windowed = Case(1, 1, 1, 4, 8, 16, mask="window", pattern="2", causal_align="bottom_right")
    # queries at positions 4..7 keep keys p-1..p+1 among the 8: 3 + 3 + 3 + 2 (no key 8)
    assert windowed.shift == 4 and windowed.pairs(windowed.kind.layout(windowed, 0)) == 11


def test_a_low_ceiling_cannot_flip_a_bound():
    """A decode row with 4 queries (GQA 4:1, float32: 7.9 FLOP per byte). The committed
    Llama-3-8B CPU run measured the matmul rate at 59 GFLOP/s, about 3x low (one thread alone
    does 95 on that machine), so the ridge came out at 3.9 FLOP/B and the row was labelled
    compute-bound. Ceilings measured while the process waited for the CPU now give no bound;
    measured ones (about 0.19 TFLOP/s, 16 GB/s: ridge 12) put the row within 2x of the ridge,
    balanced; and for every ceiling up to 2x low, no label turns into the other roof."""
    case = Case(4, 32, 8, 4, 4096, 128, causal=True, causal_align="bottom_right")
    row = {"tflops": 0.0148, "gbps": 1.86, "flops": case.flops()}
    assert 7.8 < case.flops() / case.bytes_moved() < 8.0
    low = dict(matmul_tflops={"float32": 0.0594}, copy_gb_s=15.18)
    assert roofline(row, case, Settings(**low), [])["bound"] == "compute"  # 3x low: flipped
    out = roofline(row, case, Settings(**low, ceilings_contended=True), [])
    assert "bound" not in out and out["pct_peak"] > 0
    measured = Settings(matmul_tflops={"float32": 0.19}, copy_gb_s=16.0)
    assert roofline(row, case, measured, [])["bound"] == "balanced"
    for q in (1, 4, 16, 64, 512):
        c = Case(4, 32, 8, q, 4096, 128, causal=True, causal_align="bottom_right")
        r = {"tflops": 0.01, "gbps": 1.0, "flops": c.flops()}
        true = roofline(r, c, Settings(matmul_tflops={"float32": 0.19}, copy_gb_s=16.0), [])
        for low in (1.0, 1.3, 1.7, 1.99):
            for what in ("matmul", "copy"):
                s = Settings(
                    matmul_tflops={"float32": 0.19 / (low if what == "matmul" else 1)},
                    copy_gb_s=16.0 / (low if what == "copy" else 1),
                )
                got = roofline(r, c, s, [])["bound"]
                assert {got, true["bound"]} != {"compute", "memory"}, (q, low, what)


def test_roofline_uses_the_ceiling_the_intensity_meets():
    case = Case(8, 32, 8, 1, 4096, 128, "bfloat16", causal=True, causal_align="bottom_right")
    settings = Settings(matmul_tflops={"bfloat16": 100.0}, copy_gb_s=1000.0)
    row = {"tflops": 0.5, "gbps": 800.0, "flops": case.flops()}
    out = roofline(row, case, settings, [])
    assert out["bound"] == "memory"  # 2 FLOP per byte, far below the ridge (100 FLOP/B)
    assert out["pct_peak"] == pytest.approx(80.0)
    big = Case(1, 16, 16, 4096, 4096, 128, "bfloat16")
    row = {"tflops": 60.0, "gbps": 50.0, "flops": big.flops()}
    out = roofline(row, big, settings, [])
    assert out["bound"] == "compute" and out["pct_peak"] == pytest.approx(60.0)


def test_forced_sdpa_backends_declare_their_work_with_a_bottom_right_mask(impls):
    """Bottom-right causal reaches the forced math and cuDNN backends as a dense boolean mask:
    the whole score matrix is computed; flash and efficient get causal_lower_right, whose
    kernels skip what they skip, as top-left (is_causal) does: the backend's own choice,
    undeclared."""
    decode = Case(2, 4, 2, 3, 40, 8, causal=True, causal_align="bottom_right")
    square = Case(2, 4, 2, 40, 40, 8, causal=True, causal_align="bottom_right")  # shift 0
    for name in ("sdpa_math", "sdpa_cudnn"):
        assert impls[name].work(decode, None) == 2 * 3 * 40, name
    for name in ("sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"):
        assert impls[name].work(square, None) is None, name
    for name in ("sdpa", "sdpa_flash", "sdpa_efficient"):  # causal_lower_right: PyTorch's choice
        assert impls[name].work(decode, None) is None, name
    row = run_row(impls["sdpa_math"], decode, settings=QUICK)
    assert row["status"] == "ok" and row["work_flops"] == 4.0 * 4 * 8 * 2 * 3 * 40


def test_paged_cache_holds_every_key_in_its_page():
    k, v = torch.randn(3, 2, 300, 8), torch.randn(3, 2, 300, 8)
    k_pool, v_pool, table = paged(k, v, seed=1)
    assert k_pool.shape == (9, 128, 2, 8) and table.shape == (3, 3)
    assert sorted(table.flatten().tolist()) == list(range(9))
    assert table.flatten().tolist() != list(range(9))  # shuffled
    for b, p in itertools.product(range(3), range(3)):
        n = min(128, 300 - 128 * p)
        page = k_pool[table[b, p]][:n].transpose(0, 1)  # (Hkv, n, D)
        assert torch.equal(page, k[b, :, 128 * p : 128 * p + n])


def top_left_sdpa(q, k, v, *, causal, scale, mask):
    """A planted bug: claims bottom-right but runs SDPA's top-left is_causal."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)


def test_a_top_left_impl_fails_agreement_on_a_bottom_right_case(impls):
    planted = Impl("planted_top_left", top_left_sdpa, causal_align=("top_left", "bottom_right"))
    case = Case(1, 2, 2, 4, 64, 16, causal=True, causal_align="bottom_right")
    rows = run_rows(
        [planted, *(impls[n] for n in ("naive", "sdpa", "tiled"))], case, settings=QUICK
    )
    bad = rows[planted.name]
    assert bad["status"] == "ok" and bad["agrees"] is False
    for name in ("naive", "sdpa", "tiled"):
        good = rows[name]
        assert good["status"] == "ok" and good["agrees"] is True, (name, good["reason"])


def test_impls_without_bottom_right_say_so(impls):
    from attnbench.registry import Impl as I

    plain = I("plain", top_left_sdpa)
    case = Case(1, 2, 2, 4, 64, 16, causal=True, causal_align="bottom_right")
    assert plain.reasons(case) == ["causal_align=bottom_right (supported: top_left)"]
    assert "bottom_right" in impls["flex_paged"].causal_align


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_preset_expands_to_valid_cases(name):
    m = model(name)
    phases = ["prefill", "train"] + (["decode"] if m.decoder else [])
    spec = Spec.from_preset("cpu", "cpu", model=[name], phase=phases)
    cases = spec.cases()
    assert {c.model for c in cases} == {name}
    assert {c.phase for c in cases} == set(phases)
    for c in cases:
        assert (c.heads, c.kv_heads, c.head_dim, c.causal) == (
            m.heads,
            m.kv_heads,
            m.head_dim,
            m.causal,
        )
        if c.phase == "decode":
            assert c.seq_q in DECODE_TOKENS and c.batch in DECODE_BATCH and c.mode == "fwd"
            assert c.seq_kv <= max(m.context, m.seq_kv or 0)
            assert c.causal_align == ("bottom_right" if c.causal else "top_left")
        else:
            assert c.seq_q in m.lengths and c.mode == ("fwd" if c.phase == "prefill" else "fwd_bwd")
            assert c.seq_kv == (m.seq_kv or c.seq_q)


def test_flags_override_the_model_and_the_length_flags_go_to_their_phase():
    spec = Spec.from_preset(
        "cpu",
        "cpu",
        model=["llama3-8b"],
        phase=["prefill", "decode"],
        heads=[4],
        kv_heads=[2],
        seq_len=[64],
        seq_len_kv=[256, 512],
        batch=[1],
    )
    cases = spec.cases()
    prefill = [c for c in cases if c.phase == "prefill"]
    decode = [c for c in cases if c.phase == "decode"]
    assert {(c.heads, c.kv_heads, c.head_dim, c.seq_q, c.seq_kv) for c in prefill} == {
        (4, 2, 128, 64, 64)
    }
    assert {(c.seq_q, c.seq_kv) for c in decode} == {(1, 256), (1, 512), (4, 256), (4, 512)}
    assert {c.batch for c in cases} == {1}
    gpt2 = Spec.from_preset("cpu", "cpu", model=["gpt2"], phase=["decode"]).cases()
    assert {c.seq_kv for c in gpt2} == {1024}  # caches stop at GPT-2's context


def test_gemma_alternates_window_and_global_layers():
    cases = Spec.from_preset("cpu", "cpu", model=["gemma2-9b"], phase=["prefill"]).cases()
    assert {(c.mask, c.pattern) for c in cases} == {("window", "4096"), ("none", None)}


def test_a_model_typo_is_one_line_naming_the_closest(tmp_path, capsys):
    assert main(["sweep", "--model", "lama3-8b"]) == 2
    err = capsys.readouterr().err
    assert len(own_lines(err)) == 1 and "did you mean 'llama3-8b'" in err
    assert not (tmp_path / "results").exists()
    assert main(["sweep", "--list-models"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in MODELS)


@pytest.mark.slow  # a decode sweep end to end
def test_decode_sweep_on_the_cpu_agrees_and_recommends(tmp_path):
    proc = sweep(
        "--model",
        "llama3-8b",
        "--phase",
        "decode",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--seq-len-kv",
        "200",
        "--batch",
        "2",
        "--dtype",
        "float32",
        "--impls",
        "naive,sdpa,flex_paged,xformers",
        "--rep-ms",
        "2",
        "--no-isolate",
        "--run-id",
        "llama",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = read_results(tmp_path / "results" / "llama")
    decode = df[df["phase"] == "decode"]
    assert set(decode["causal_align"]) == {"bottom_right"}
    for name in ("naive", "sdpa", "flex_paged"):
        rows = decode[decode["impl"] == name]
        assert len(rows) == 2 and (rows["status"] == "ok").all(), rows["reason"].tolist()
        assert rows["agrees"].all() and rows["gbps"].gt(0).all()
    assert (df[df["impl"] == "xformers"]["status"] == "unsupported").all()
    report = (tmp_path / "reports" / "llama" / "report.md").read_text()
    section = report.split("## Recommendations")[1].split("\n## ")[0]
    assert "| llama3-8b | decode |" in section
    assert "xformers: unsupported" in section


def test_old_rows_without_the_new_columns_still_read(tmp_path):
    inputs = make_inputs(Case(1, 1, 1, 4, 4, 8), 0)
    assert inputs.seed == 0
    csv = tmp_path / "results.csv"
    csv.write_text("run_id,impl,mode,status\nr,naive,fwd,ok\n")
    df = read_results(csv)
    assert df["causal_align"].iloc[0] == "top_left" and df["model"].isna().all()


def test_phases_work_without_a_model():
    cases = Spec.from_preset("cpu", "cpu", phase=["decode", "train"]).cases()
    decode = [c for c in cases if c.phase == "decode"]
    assert {c.seq_q for c in decode} == set(DECODE_TOKENS) and {c.mode for c in decode} == {"fwd"}
    assert {(c.causal, c.causal_align) for c in decode} == {(True, "bottom_right")}  # causal
    train = [c for c in cases if c.phase == "train"]
    assert {c.mode for c in train} == {"fwd_bwd"} and all(c.seq_q == c.seq_kv for c in train)
    assert {c.model for c in cases} == {""}


def test_forced_flash_gets_the_bottom_right_path_sdpa_runs_decode_rows_by(impls, monkeypatch):
    """Decode rows (bottom-right causal, Sq < Skv): sdpa runs them through causal_lower_right,
    whose flash path CUDA's flash backend takes; sdpa_flash gets the same bias (a dense mask
    would be refused there: flash takes no attn_mask), sdpa_math the dense mask."""
    import torch.nn.attention.bias as torch_bias

    real, given = torch_bias.causal_lower_right, []
    monkeypatch.setattr(torch_bias, "causal_lower_right", lambda *a: given.append(a) or real(*a))
    decode = Case(1, 4, 2, 4, 40, 8, causal=True, causal_align="bottom_right")
    for name, biased in (("sdpa", True), ("sdpa_flash", True), ("sdpa_math", False)):
        given.clear()
        row = run_row(impls[name], decode, settings=QUICK)
        assert row["status"] == "ok" and row["agrees"] is True, (name, row["reason"])
        assert bool(given) is biased and all(a == (4, 40) for a in given), name
