"""A CPU sweep of packed documents and a sparse pattern, end to end: ok, agreeing rows for
naive, tiled and flex, and the report's wasted-work and sparsity sections."""

import pytest

from attnbench.cli import main
from attnbench.report import report as report_module
from attnbench.store.results import read_results


@pytest.mark.slow  # a sweep of documents and sparse patterns with its report
def test_cpu_sweep_of_documents_and_sparse_patterns_agrees_and_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(report_module, "FIGURES", ())  # the figures are not under test here
    code = main(
        [
            "sweep",
            *("--device", "cpu", "--impls", "naive,tiled,flex", "--batch", "1", "--heads", "2"),
            *("--head-dim", "16", "--seq-len", "160", "--causal", "false", "--mode", "fwd"),
            *("--mask", "document,block_sparse", "--docs", "uniform:16-64"),
            *("--sparsity", "block=32:local=1:global=1:random=1", "--rep-ms", "2"),
            *("--results-dir", str(tmp_path / "res"), "--reports-dir", str(tmp_path / "rep")),
            *("--run-id", "packed", "--no-isolate", "--no-progress"),
        ]
    )
    assert code == 0
    df = read_results(tmp_path / "res" / "packed")
    assert len(df) == 6 and set(df["mask"]) == {"document", "block_sparse"}
    assert (df["status"] == "ok").all(), df["reason"].tolist()
    assert df["agrees"].all(), df["reason"].tolist()
    assert (df["work_flops"] >= df["flops"]).all()
    assert set(df["pattern"]) == {"uniform:16-64", "block=32:local=1:global=1:random=1"}
    report = (tmp_path / "rep" / "packed" / "report.md").read_text()
    assert "### Wasted work (packed documents, sparse patterns)" in report
    assert "### Sparsity: time against N and against kept pairs" in report
    assert "| tiled | fwd full block_sparse block=32:local=1:global=1:random=1" in report
