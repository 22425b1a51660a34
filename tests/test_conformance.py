"""Every registered impl against the float64 reference on the conformance grid
(attnbench/testing.py), through the sweep's own row: a new impl is tested here without editing
a list. An impl skips a case by its own reasons (CUDA only, not installed, a mask or an
alignment it does not declare, the layer level), which the skip shows."""

import pytest

from attnbench import plugins
from attnbench.case import Case
from attnbench.testing import conformance_cases, run_row

IMPLS = plugins.discover()
# torch.compile impls compile each shape (seconds each): the default run keeps their own tests
# (test_compiled.py, test_mask_kinds.py), the grid runs with -m ""
NAMES = [pytest.param(n, marks=pytest.mark.slow) if IMPLS[n].compiled else n for n in sorted(IMPLS)]


@pytest.mark.parametrize("case", conformance_cases(), ids=Case.label)
@pytest.mark.parametrize("name", NAMES)
def test_every_impl_agrees_or_says_why_not(name, case):
    """The default grid for every impl, skipped by its own reasons (a plugin that declares
    other head dims, dtypes or no GQA gets its own grid from conformance_cases(impl):
    docs/plugins.md "Testing your impl", tested in test_docs.py)."""
    impl = IMPLS[name]
    reasons = impl.reasons(case)
    if reasons:
        pytest.skip("; ".join(reasons))
    row = run_row(impl, case)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert row["rel_err"] <= row["err_bound"]
    assert row["time_ms"] > 0 and row["peak_mem_mib"] >= 0 and row["recompiled"] is False
