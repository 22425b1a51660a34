"""--cuda-graph: refused off CUDA in one line; backward modes unsupported with a reason; on a GPU
the timed call is captured once and its replays timed, and the row says so."""

from __future__ import annotations

import pytest
import torch

from attnbench.case import Case
from attnbench.cli import main
from attnbench.measure.cuda_graph import GraphCaptureError, capture
from attnbench.measure.timing import TimerConfig, time_fn
from attnbench.run.measuring.row import Settings
from attnbench.store.schema import COLUMNS, METRICS
from attnbench.testing import run_row

GRAPHED = Settings(TimerConfig(rep_ms=5.0, cuda_graph=True))


def test_cuda_graph_is_refused_on_the_cpu_in_one_line(tmp_path, capsys):
    code = main(["sweep", "--device", "cpu", "--cuda-graph", "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "--cuda-graph replays CUDA graphs, but the device is cpu" in err
    assert not (tmp_path / "r").exists()


def test_the_cpu_timer_refuses_a_graph():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        time_fn(lambda: None, "cpu", TimerConfig(cuda_graph=True))


def test_backward_modes_are_not_captured_and_say_why(impls):
    c = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16, mode="fwd_bwd")
    row = run_row(impls["sdpa"], c, settings=GRAPHED)
    assert row["status"] == "unsupported"
    assert row["reason"] == (
        "mode=fwd_bwd with --cuda-graph (supported: fwd; a backward is not captured)"
    )
    assert row["cuda_graph"] is None  # blank in a row that did not run


def test_the_row_records_how_it_was_timed():
    assert COLUMNS["cuda_graph"][0] == "boolean" and "cuda_graph" in METRICS
    # appended, as the precision columns after it: earlier columns keep their places
    assert list(COLUMNS)[-3:] == ["cuda_graph", "precision_ratio", "precision_low"]


@pytest.mark.gpu
def test_replays_leave_out_the_launch_cost_of_many_small_kernels():
    x = torch.zeros(1024, device="cuda")

    def many_launches():
        for _ in range(200):
            x.add_(1.0)

    eager = time_fn(many_launches, "cuda", TimerConfig(rep_ms=50))
    graphed = time_fn(many_launches, "cuda", TimerConfig(rep_ms=50, cuda_graph=True))
    assert 5 <= len(graphed.samples_ms) <= TimerConfig().max_samples
    assert graphed.median_ms < eager.median_ms  # 200 launches from Python cost more


@pytest.mark.gpu
def test_a_call_that_syncs_with_the_host_cannot_be_captured():
    x = torch.ones(4, device="cuda")
    with pytest.raises(GraphCaptureError, match="cannot be captured in a CUDA graph"):
        capture(lambda: x.sum().item())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa", "naive", "flash_attn2", "flashinfer"])
def test_a_decode_row_timed_by_graph_replay_agrees_and_says_so(impls, name):
    impl = impls[name]
    if not impl.available:
        pytest.skip(impl.unavailable)
    c = Case(
        batch=8,
        heads=32,
        kv_heads=8,
        seq_q=1,
        seq_kv=4096,
        head_dim=128,
        dtype="bfloat16",
        causal=True,
        causal_align="bottom_right",
        device="cuda",
    )
    row = run_row(impl, c, settings=GRAPHED)
    assert row["status"] in ("ok", "unsupported"), row["reason"]
    if row["status"] == "ok":
        assert row["agrees"] is True and row["cuda_graph"] is True, row["reason"]
        assert row["time_ms"] > 0
