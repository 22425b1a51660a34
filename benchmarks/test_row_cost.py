"""The harness's fixed cost per row (benchmarks/row_cost.py), as a pytest-benchmark entry: one
round of a few tiny in-process rows. The test command runs it once (a smoke test of the
benchmark); ``pytest benchmarks/test_row_cost.py --benchmark-enable`` measures, and
``python benchmarks/row_cost.py`` prints seconds per row for both executors."""

import row_cost

ROWS = 8


def test_fixed_cost_per_tiny_row(benchmark):
    per_row = benchmark.pedantic(row_cost.per_row_s, args=("inprocess", ROWS), rounds=1)
    benchmark.extra_info["seconds_per_row"] = per_row
    assert per_row > 0
