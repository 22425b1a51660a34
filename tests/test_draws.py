"""Reproducible draws: one table of seed streams, and every drawn quantity of a case stored in
the run's draws file, from which the case's masks can be rebuilt without the seed."""

import json

import pytest
import torch

from attnbench.case import Case
from attnbench.cli import main
from attnbench.run.measuring.inputs import draws, from_draws, make_inputs, paged
from attnbench.seeds import STREAMS, generator
from attnbench.store.results import read_results
from attnbench.store.rundir import RunDir, read_draws


def test_seed_streams_have_distinct_offsets_and_give_distinct_draws():
    assert len(set(STREAMS.values())) == len(STREAMS)
    first = {s: torch.randint(0, 2**31, (4,), generator=generator(s, 7)).tolist() for s in STREAMS}
    assert len({tuple(v) for v in first.values()}) == len(STREAMS)


def test_a_large_tensor_is_drawn_in_parallel_pieces_the_same_whatever_the_threads(monkeypatch):
    """Over DRAW_WHOLE elements, each batch element has a generator of its own, so the draw
    is the same on 1 or many threads, the pieces differ, and the smaller tensors drawn after
    it (dout) are not moved by how the large one was drawn."""
    from attnbench.run.measuring import inputs as inputs_module

    case = Case(3, 2, 2, 8, 64, 8, mode="bwd")  # k, v: 3 x 2 x 64 x 8 = 3072 elements
    monkeypatch.setattr(inputs_module, "DRAW_WHOLE", 1024)  # k and v drawn in pieces, q not
    draws_by_threads = []
    for threads in (1, 3):
        monkeypatch.setattr(inputs_module, "DRAW_THREADS", threads)
        draws_by_threads.append(make_inputs(case, 11))
    one, many = draws_by_threads
    for name in ("q", "k", "v", "dout"):
        assert torch.equal(getattr(one, name), getattr(many, name)), name
    assert not torch.equal(one.k[0], one.k[1]) and not torch.equal(one.k, one.v)
    assert abs(float(one.k.std()) - 1.0) < 0.1  # standard normal, like the whole draws


def test_the_page_order_of_a_paged_cache_is_stored_and_is_the_block_table():
    case = Case(3, 4, 2, 1, 300, 8, causal=True, causal_align="bottom_right")
    inputs = make_inputs(case, 5)
    record = draws(case, 5, paged=True)
    assert record["streams"] == {"pages": STREAMS["pages"]} and record["seed"] == 5
    _, _, table = from_draws(json.loads(json.dumps(record)))
    assert torch.equal(table, paged(inputs.k, inputs.v, 5)[2])  # (B, P) = (3, 3)
    assert draws(case, 5) is None  # nothing drawn beyond q, k, v without a paged impl


@pytest.mark.slow  # a sweep of every drawn mask kind
def test_a_runs_draws_rebuild_its_masks_and_its_rows_flops(tmp_path):
    common = ["--device", "cpu", "--batch", "2", "--heads", "2", "--head-dim", "8"]
    common += ["--causal", "false", "--mode", "fwd", "--rep-ms", "1", "--no-progress"]
    common += ["--results-dir", str(tmp_path), "--no-report", "--impls", "naive"]
    code = main(
        [
            "sweep",
            *common,
            "--seq-len",
            "96,128",
            "--mask",
            "none,padding,document,block_sparse",
            "--docs",
            "uniform:8-40",
            "--sparsity",
            "block=16:local=1:global=1:random=2",
            "--seed",
            "11",
            "--run-id",
            "d",
        ]
    )
    assert code == 0
    stored = read_draws(tmp_path / "d")
    rows = read_results(tmp_path / "d")
    drawing = rows[rows["mask"] != "none"]
    assert len(stored) == len(drawing) == 6  # one record per case that draws, none for none
    lines = (tmp_path / "d" / RunDir.DRAWS).read_text().splitlines()
    assert len(lines) == 6
    for _, r in drawing.iterrows():
        case, pattern, _ = from_draws(stored[Case.from_row(r).label()])
        assert case == Case.from_row(r)
        # the row's FLOPs were counted in the worker from its own draws
        assert case.flops(pattern) == r["flops"]
        # and they are what the seed gives
        mask = make_inputs(case, 11).mask
        if case.mask == "padding":
            assert torch.equal(pattern.kv_lens, mask.kv_lens)
        if case.mask == "document":
            assert pattern.doc_lens == mask.pattern.doc_lens
        if case.mask == "block_sparse":
            assert torch.equal(pattern.layout(), mask.pattern.layout())
            assert pattern.random.shape == (case.seq_q // 16, 2)
