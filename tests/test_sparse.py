"""Sparse patterns (masks block_sparse, strided): the layouts against rules written out here,
the reference, pair counts by hand, impls against the reference, an impl that ignores global
tokens caught, the report's sparsity verdict, and a CPU sweep end to end."""

import math
import textwrap

import pytest
import synth
import torch

from attnbench import plugins
from attnbench.case import Case, CaseError
from attnbench.cli import main
from attnbench.masks import Mask
from attnbench.measure import reference
from attnbench.report.analyse.patterns import sparsity_fits
from attnbench.run.measuring.inputs import make_inputs
from attnbench.spec import Spec
from attnbench.store.results import read_results
from attnbench.testing import run_row

BIGBIRD = "block=8:local=3:global=1:random=2"


def sparse_case(mask, spec, seq=60, causal=False, mode="fwd", heads=2, kv_heads=2):
    return Case(
        batch=2,
        heads=heads,
        kv_heads=kv_heads,
        seq_q=seq,
        seq_kv=seq,
        head_dim=8,
        causal=causal,
        mode=mode,
        mask=mask,
        pattern=spec,
    )


def loop_keep(pattern, seq, causal):
    """The rules, one (i, j) at a time, from the pattern's parameters and random draw."""
    keep = torch.zeros(1, 1, seq, seq, dtype=torch.bool)
    P = pattern.block
    for i in range(seq):
        for j in range(seq):
            a, c = i // P, j // P
            if pattern.kind == "strided":
                kept = abs(a - c) < pattern.stride or (a - c) % pattern.stride == 0
            else:
                kept = (
                    abs(a - c) <= (pattern.local - 1) // 2
                    or a < pattern.n_global
                    or c < pattern.n_global
                    or c in pattern.random[a].tolist()
                )
            keep[0, 0, i, j] = kept and (j <= i or not causal)
    return keep


def test_random_blocks_are_seeded_and_outside_window_and_globals():
    case = sparse_case("block_sparse", "block=4:local=3:global=2:random=3", seq=64)
    drawn = make_inputs(case, 7).mask.pattern.random  # (16, 3)
    assert torch.equal(drawn, make_inputs(case, 7).mask.pattern.random)
    assert not torch.equal(drawn, make_inputs(case, 8).mask.pattern.random)
    assert (drawn[:2] == -1).all()  # global query blocks already see everything
    for a in range(2, 16):
        picks = drawn[a].tolist()
        assert len(set(picks)) == 3 and all(c >= 2 and abs(a - c) > 1 for c in picks)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask,spec", [("block_sparse", BIGBIRD), ("strided", "block=4:stride=3")])
def test_reference_and_dense_mask_follow_the_rule(monkeypatch, mask, spec, causal):
    monkeypatch.setattr(reference, "CHUNK_BYTES", 7 * 8 * 2 * 2 * 30)  # 7 query rows a chunk
    case = sparse_case(mask, spec, seq=30, causal=causal)  # the last block is short
    pattern = make_inputs(case, 3).mask.pattern
    keep = loop_keep(pattern, 30, causal)
    assert torch.equal(make_inputs(case, 3).mask.keep(30, 30, causal, "cpu"), keep)
    q, k, v, dout = (
        torch.randn(
            2, 2, 30, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(s)
        ).requires_grad_(True)
        for s in range(4)
    )
    out, grads = reference.reference(
        q, k, v, causal=causal, scale=0.5, dout=dout.detach(), mask=Mask(layout=pattern)
    )
    want = ((q @ k.transpose(-1, -2)) * 0.5).masked_fill(~keep, -math.inf).softmax(-1) @ v
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for got, exp in zip(grads, torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal,per_row", [(False, 14 * 4), (True, 5 * 4 + 4 * 3)])
def test_strided_pairs_by_hand(causal, per_row):
    # 4 blocks of 2, stride 2: block rows keep 3, 4, 4, 3 blocks (14 of 16); causal: 5 whole
    # blocks below the diagonal and 4 triangles of 3 pairs on it
    case = sparse_case("strided", "block=2:stride=2", seq=8, causal=causal, mode="bwd")
    pattern = make_inputs(case, 0).mask.pattern
    assert case.pairs(layout=pattern) == 2 * per_row
    assert case.flops(layout=pattern) == 2.5 * 4 * 2 * (2 * per_row) * 8


def test_block_sparse_pairs_by_hand():
    # 3 blocks of 4 (the last one of 2), local 1 (the diagonal), block 0 global, no random:
    # blocks (0, *), (*, 0) and the diagonal: 4x4 + 4x4 + 4x2 + 4x4 + 2x4 + 4x4 + 2x2
    case = sparse_case("block_sparse", "block=4:local=1:global=1:random=0", seq=10)
    assert case.pairs(layout=make_inputs(case, 0).mask.pattern) == 2 * (16 * 4 + 8 * 2 + 4)


STRIDED = "block=8:stride=3"


@pytest.mark.parametrize(
    "name,mask,spec,causal",
    [
        *(("tiled", m, p, c) for m, p in (("block_sparse", BIGBIRD), ("strided", STRIDED))
          for c in (False, True)),
        ("naive", "block_sparse", BIGBIRD, True),
        ("sdpa", "strided", STRIDED, False),
    ],
)  # fmt: skip
def test_impls_agree_under_sparse_patterns(impls, monkeypatch, name, mask, spec, causal):
    globals_ = impls["tiled"].fn.__globals__
    monkeypatch.setitem(globals_, "BLOCK_Q", 8)  # tiles of the pattern's size: empty ones
    monkeypatch.setitem(globals_, "BLOCK_K", 8)  # skipped
    case = sparse_case(mask, spec, seq=60, causal=causal, mode="fwd_bwd", heads=4, kv_heads=2)
    row = run_row(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    if name == "tiled":  # tiles of the pattern's blocks: it visits the kept ones only
        keep = loop_keep(make_inputs(case, 0).mask.pattern, 60, causal)[0, 0]
        visited = sum(
            min(8, 60 - r) * min(8, 60 - c)
            for r in range(0, 60, 8)
            for c in range(0, 60, 8)
            if keep[r : r + 8, c : c + 8].any()
        )
        assert row["work_flops"] == 3.5 * 4 * 4 * 8 * 2 * visited
        assert (row["work_flops"] == row["flops"]) is not causal  # causal cuts the diagonal


def test_ignoring_global_tokens_disagrees(tmp_path):
    path = tmp_path / "no_globals.py"
    path.write_text(
        textwrap.dedent("""
        from attnbench.registry import register

        @register("no_globals", masks=("block_sparse",))
        def no_globals(q, k, v, *, causal, scale, mask):
            p = mask.pattern
            keep = mask.keep(q.shape[-2], k.shape[-2], causal, q.device).clone()
            a = (keep.new_ones(keep.shape[-2:]).nonzero()[:, 0] // p.block).view(keep.shape[-2:])
            c = a.T
            window = (a - c).abs() <= (p.local - 1) // 2
            drawn = (p.random[a] == c[..., None]).any(-1)
            keep &= window | drawn  # the global rows and columns left out
            s = q @ k.transpose(-1, -2) * scale
            return s.masked_fill(~keep, float("-inf")).softmax(-1) @ v
    """)
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["no_globals"]
    row = run_row(impl, sparse_case("block_sparse", "block=8:local=3:global=1:random=1", seq=64))
    assert row["status"] == "ok" and row["agrees"] is False
    assert "disagrees with the float64 reference" in row["reason"]


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(pattern="block=8:stride=2"), "'stride=2' is not a key=value of mask block_sparse"),
        (dict(pattern="local=2"), "local=2 must be odd"),
        (dict(pattern="block=0"), "block=0 must be an integer >= 1"),
        (dict(pattern="4", mask="none"), "pattern='4' needs mask"),
    ],
)
def test_bad_sparse_cases_are_refused(kw, message):
    args = dict(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=8)
    with pytest.raises(CaseError, match=message):
        Case(**(args | dict(mask="block_sparse") | kw))


def sparsity_run(tmp_path, series):
    """A synthetic results.csv of block_sparse rows, one series per impl: ``series`` maps
    impl -> [(N, kept pairs per head, time_ms)]; read back as the report reads it."""
    rows = []
    for impl, points in series.items():
        for n, pairs, t in points:
            case = Case(batch=1, heads=2, kv_heads=2, seq_q=n, seq_kv=n, head_dim=32,
                        mask="block_sparse", pattern=BIGBIRD)  # fmt: skip
            rows.append(
                dict(run_id="sparse", impl=impl, **case.columns(), status="ok", time_ms=t,
                     flops=4.0 * 2 * 32 * pairs, agrees=True, seed=0)
            )  # fmt: skip
    return read_results(synth.write_run(tmp_path, "sparse", rows))


def test_sparsity_verdicts_decide_on_time_against_kept_pairs_over_the_same_points(tmp_path):
    n = [256, 512, 1024, 2048, 4096, 8192]
    lin = [s * 768 for s in n]  # a BigBird-like pattern: kept pairs linear in N
    slow = [int(s**1.03) * 50 for s in n]  # pairs like N^1.03
    df = sparsity_run(
        tmp_path,
        {
            # an overhead floor at small N: the fits keep the large N only
            "skips": [(s, p, 0.5 + p * 1e-4) for s, p in zip(n, lin)],
            "masks": [(s, p, 0.5 + s * s * 1e-5) for s, p in zip(n, lin)],
            # time like N^1.5 while the pairs grow like N^1.03: neither prediction
            "between": [(s, p, 0.5 + s**1.5 * 1e-3) for s, p in zip(n, slow)],
            # pairs like N^1.8: pairs^1 and N^2 = pairs^1.11 too close to tell apart
            "dense": [(s, int(s**1.8), 0.5 + s * s * 1e-5) for s in n],
        },
    )
    fits = sparsity_fits(df).set_index("impl")
    assert fits.loc["skips", "time_vs_pairs"] == pytest.approx(1.0, abs=0.05)
    assert fits.loc["skips", "verdict"] == "exploits sparsity (time follows the kept pairs)"
    assert fits.loc["masks", "time_vs_n"] == pytest.approx(2.0, abs=0.05)
    assert fits.loc["masks", "verdict"].startswith("masks only (time grows like N^2")
    between = fits.loc["between"]
    assert between["pairs_exp"] == pytest.approx(1.03, abs=0.01)
    assert between["time_vs_pairs"] == pytest.approx(1.5 / 1.03, abs=0.05)
    # nearer the pairs' exponent than 2 in N (1.5 vs 1.03 and 2): once called "exploits"
    assert abs(between["time_vs_n"] - 1.03) < abs(between["time_vs_n"] - 2)
    assert between["verdict"].startswith("cannot tell: time grows like pairs^1.4")
    assert fits.loc["dense", "verdict"].startswith("cannot tell: kept pairs grow like N^1.80")
    # the pairs are fitted over the points the time's fit kept (the overhead cut)
    assert (fits["n_points"] < len(n)).all()


def test_each_sparsity_spec_goes_to_the_masks_with_its_keys():
    spec = Spec.from_preset(
        "smoke",
        "cpu",
        mask=["block_sparse", "strided"],
        sparsity=["block=16:random=0", "stride=8", "block=32"],
        seq_len=[64],
        causal=[False],
        mode=["fwd"],
    )
    got = {(c.mask, c.pattern) for c in spec.cases()}
    assert got == {
        ("block_sparse", "block=16:local=3:global=1:random=0"),
        ("block_sparse", "block=32:local=3:global=1:random=2"),
        ("strided", "block=64:stride=8"),
        ("strided", "block=32:stride=4"),
    }


def test_a_sparsity_spec_no_swept_mask_takes_is_one_line_exit_2(tmp_path, capsys):
    args = ["--mask", "block_sparse", "--sparsity", "stride=4"]
    code = main(["sweep", "--preset", "smoke", "--results-dir", str(tmp_path / "r"), *args])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--sparsity 'stride=4' fits none of the masks" in lines[0]
