"""Packed documents (mask document): the drawn lengths, the reference against a rule written
out here, pair counts by hand, the impls against the reference, a leaking impl caught, and
bad specs refused."""

import math
import textwrap

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case, CaseError
from attnbench.cli import main
from attnbench.measure import reference
from attnbench.run.measuring.inputs import make_inputs
from attnbench.testing import run_row


def doc_case(spec, seq=96, causal=False, mode="fwd", batch=2, heads=2, kv_heads=2):
    return Case(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        seq_q=seq,
        seq_kv=seq,
        head_dim=8,
        causal=causal,
        mode=mode,
        mask="document",
        pattern=spec,
    )


def same_document(lens, i, j):
    """The rule, from the lengths alone: walk the documents until one holds position p."""

    def which(p):
        end = 0
        for number, n in enumerate(lens):
            end += n
            if p < end:
                return number
        raise AssertionError(f"position {p} past the sequence")

    return which(i) == which(j)


def loop_keep(doc_lens, seq, causal):
    keep = torch.zeros(len(doc_lens), 1, seq, seq, dtype=torch.bool)
    for b, lens in enumerate(doc_lens):
        for i in range(seq):
            for j in range(seq):
                keep[b, 0, i, j] = same_document(lens, i, j) and (j <= i or not causal)
    return keep


@pytest.mark.parametrize(
    "spec,want",
    [
        ("fixed:32", [[32, 32, 32], [32, 32, 32]]),
        ("40+20", [[40, 20, 36], [40, 20, 36]]),  # cycled, the last one cut to fit
        ("fixed:500", [[96], [96]]),
    ],
)
def test_fixed_and_listed_lengths_fill_each_sequence(spec, want):
    assert make_inputs(doc_case(spec), 0).mask.pattern.doc_lens == want


def test_uniform_lengths_are_seeded_in_range_and_leave_q_k_v_alone():
    case = doc_case("uniform:5-20", seq=200, batch=3)
    a, b, other = (make_inputs(case, s) for s in (4, 4, 5))
    lens = a.mask.pattern.doc_lens
    assert lens == b.mask.pattern.doc_lens != other.mask.pattern.doc_lens
    for row in lens:
        assert sum(row) == 200 and all(5 <= n <= 20 for n in row[:-1]) and 1 <= row[-1] <= 20
    assert lens[0] != lens[1]  # every batch row draws its own documents
    plain = make_inputs(Case(3, 2, 2, 200, 200, 8), 4)
    assert torch.equal(plain.q, a.q) and torch.equal(plain.v, a.v)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_keeps_attention_inside_each_document(monkeypatch, causal):
    monkeypatch.setattr(reference, "CHUNK_BYTES", 5 * 8 * 2 * 23)  # 5 query rows per chunk
    case = doc_case("7+3+9", seq=23, causal=causal)
    inputs = make_inputs(case, 1)
    q, k, v, dout = (
        torch.randn(
            2, 2, 23, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(s)
        ).requires_grad_(True)
        for s in range(4)
    )
    out, grads = reference.reference(
        q, k, v, causal=causal, scale=0.5, dout=dout.detach(), mask=inputs.mask
    )
    keep = loop_keep(inputs.mask.pattern.doc_lens, 23, causal)
    want = ((q @ k.transpose(-1, -2)) * 0.5).masked_fill(~keep, -math.inf).softmax(-1) @ v
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    for got, exp in zip(grads, torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)
    dense = inputs.mask.keep(23, 23, causal, "cpu")  # what the impls get
    assert torch.equal(dense, keep)


@pytest.mark.parametrize(
    "causal,pairs",
    [(False, 7 * 7 + 3 * 3 + 9 * 9 + 4 * 4), (True, 28 + 6 + 45 + 10)],  # 7+3+9, then 4 cut
)
def test_pairs_and_flops_sum_over_documents(causal, pairs):
    case = doc_case("7+3+9", seq=23, causal=causal, mode="fwd_bwd")
    pattern = make_inputs(case, 0).mask.pattern
    assert pattern.doc_lens == [[7, 3, 9, 4]] * 2
    assert case.pairs(layout=pattern) == 2 * pairs
    assert case.flops(layout=pattern) == 3.5 * 4 * 2 * (2 * pairs) * 8
    with pytest.raises(ValueError, match="needs the case's drawn layout"):
        case.pairs()


@pytest.mark.parametrize(
    "name,causal",
    [("tiled", False), ("tiled", True), ("sdpa_padded", False), ("sdpa_padded", True),
     ("naive", True), ("sdpa", False)],
)  # fmt: skip
def test_impls_agree_inside_documents(impls, monkeypatch, name, causal):
    globals_ = impls["tiled"].fn.__globals__
    monkeypatch.setitem(globals_, "BLOCK_Q", 16)  # tiles smaller than the documents: some
    monkeypatch.setitem(globals_, "BLOCK_K", 8)  # skipped, some whole, some cut
    case = doc_case("uniform:10-40", seq=80, causal=causal, mode="fwd_bwd", heads=4, kv_heads=2)
    row = run_row(impls[name], case)
    assert row["status"] == "ok", row["reason"]
    assert row["agrees"] is True, row["reason"]
    assert row["work_flops"] >= row["flops"] > 0


def test_nested_runs_documents_and_says_why_not_causal(impls):
    row = run_row(impls["sdpa_nested"], doc_case("uniform:10-40", mode="fwd_bwd"))
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert row["work_flops"] == row["flops"]  # one matrix per document: nothing wasted
    row = run_row(impls["sdpa_nested"], doc_case("uniform:10-40", causal=True))
    if torch.version.cuda and not torch.cuda.is_available() and "driver" in row["reason"]:
        # a CUDA build on a machine without a driver (scripts/check_image.sh): PyTorch's
        # nested SDPA asks the driver before it refuses causal, and that call fails
        pytest.skip(f"a CUDA build of torch without a driver: {row['reason'][:200]}")
    assert row["status"] == "unsupported"
    assert "is_causal" in row["reason"] and row["time_ms"] is None


def test_every_impl_declaring_gqa_runs_gqa_documents_or_says_why(impls):
    """An impl that declares GQA and documents never errors on a GQA document case: it runs
    (and agrees), or the library refuses it as unsupported in its own words."""
    case = doc_case("uniform:10-40", heads=4, kv_heads=2)
    for name, impl in impls.items():
        if impl.compiled or impl.reasons(case):
            continue  # torch.compile impls: tests/test_compiled.py
        row = run_row(impl, case)
        assert row["status"] in ("ok", "unsupported"), (name, row["reason"])
        assert row["status"] == "unsupported" or row["agrees"] is True, (name, row["reason"])
    assert impls["sdpa_nested"].reasons(case) == [
        "kv_heads=2 < heads=4 (supported: kv_heads == heads)"
    ]


def test_work_counts_follow_each_impl_s_shapes(impls):
    case = doc_case("fixed:256", seq=512, batch=1)  # docs aligned with tiled's 128x256 tiles
    mask = make_inputs(case, 0).mask
    assert impls["tiled"].work(case, mask) == 2 * 256 * 256 == case.pairs(layout=mask.pattern)
    assert impls["naive"].work(case, mask) == 512 * 512
    assert impls["sdpa_padded"].work(case, mask) == 2 * 256 * 256
    uneven = doc_case("100+20", seq=240, batch=1)
    assert impls["sdpa_padded"].work(uneven, make_inputs(uneven, 0).mask) == 4 * 100 * 100


def test_a_leak_into_the_previous_document_disagrees(tmp_path):
    path = tmp_path / "leaky.py"
    path.write_text(
        textwrap.dedent("""
        from attnbench.registry import register

        @register("leaky", masks=("document",))
        def leaky(q, k, v, *, causal, scale, mask):
            ids = mask.pattern.doc_ids(q.device)  # (B, S)
            i, j = ids[:, None, :, None], ids[:, None, None, :]
            keep = (i == j) | (i == j + 1)  # also sees the whole previous document
            s = q @ k.transpose(-1, -2) * scale
            return s.masked_fill(~keep, float("-inf")).softmax(-1) @ v
    """)
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["leaky"]
    row = run_row(impl, doc_case("fixed:24"))
    assert row["status"] == "ok" and row["agrees"] is False
    assert "disagrees with the float64 reference" in row["reason"]


def test_xformers_takes_documents_on_cuda_only(impls):
    row = run_row(impls["xformers"], doc_case("fixed:24"))
    assert row["status"] == "unsupported"
    # its reason: the device; or, where xformers is not installed or was built for another
    # torch (its build record), that
    reasons = ("device=cpu (supported: cuda)", "needs xformers", "refuses every operator")
    assert any(why in row["reason"] for why in reasons), row["reason"]


@pytest.mark.gpu  # xformers builds its bias in pinned memory, which needs CUDA
def test_xformers_block_diagonal_bias_is_the_document_rule():
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from attnbench.impls.xformers_mea import document_bias

    for causal in (False, True):
        pattern = make_inputs(doc_case("uniform:5-30", seq=48, causal=causal), 0).mask.pattern
        bias = document_bias(pattern, causal, "cuda").materialize((96, 96)).cpu()
        keep = torch.block_diag(*pattern.dense(causal, "cpu")[:, 0])  # batch rows never mix
        assert torch.equal(bias == 0, keep)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(pattern="uniform:9-3"), "--docs 'uniform:9-3' is not a documents spec"),
        (dict(pattern="fixed:0"), "is not a documents spec"),
        (dict(seq_kv=64), "mask=document is self-attention"),
        (dict(mask="padding"), "needs mask window or document or block_sparse or strided"),
    ],
)
def test_bad_document_cases_are_refused(kw, message):
    args = dict(
        batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=8, mask="document"
    ) | dict(pattern="fixed:8")
    with pytest.raises(CaseError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Case(**(args | kw))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mask", "document", "--docs", "lots"], "--docs 'lots': 'lots' is not a documents"),
        (["--mask", "padding", "--docs", "fixed:8"], "--docs needs --mask document"),
        (["--mask", "document", "--seq-len-kv", "32"], "mask=document is self-attention"),
    ],
)
def test_bad_document_flags_are_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    code = main(["sweep", "--preset", "smoke", "--results-dir", str(tmp_path / "res"), *args])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "res").exists()


def test_results_written_before_the_pattern_columns_still_read(tmp_path):
    from attnbench.report.analysis import analyse_device
    from attnbench.report.render.patterns import sections
    from attnbench.store.results import read_results, row_key
    from attnbench.store.schema import COLUMNS

    old = [c for c in COLUMNS if c not in ("pattern", "work_flops")]
    row = dict.fromkeys(old, "") | dict(
        run_id="old", impl="naive", mode="fwd", batch="1", heads="2", kv_heads="2", seq_q="8",
        seq_kv="8", head_dim="4", dtype="float32", causal="False", device="cpu",
        status="ok", mask="none", level="op", time_ms="1.0", flops="512.0",
    )  # fmt: skip
    path = tmp_path / "results.csv"
    path.write_text(",".join(old) + "\n" + ",".join(row[c] for c in old) + "\n")
    df = read_results(path)
    assert df["pattern"].isna().all()
    assert Case.from_row(df.iloc[0]) == Case(1, 2, 2, 8, 8, 4)
    assert row_key(row)[-1] == ""  # resume matches it to a new row of the same case
    assert sections(analyse_device(df)) == []  # no pattern rows: no wasted-work section
