"""Compiled impls that share a process never share compiled code: dynamo is reset when the
compiled impl changes (measure/compiling.py ``isolate``)."""

import textwrap

import pytest
import torch._dynamo

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import compiling
from attnbench.testing import FAST, run_rows

FLEX_COPY = """
from torch.nn.attention.flex_attention import flex_attention

from attnbench.impls.flex import block_mask
from attnbench.masks import ALIGNS, MASKS
from attnbench.measure.compiling import compile_static
from attnbench.registry import register

_flex = compile_static(flex_attention)


@register("flex_copy", masks=MASKS, causal_align=ALIGNS, compiled=True, backward=False)
def flex_copy(q, k, v, *, causal, scale, mask):
    bm = block_mask(q, k, causal, mask)
    return _flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
"""


def test_dynamo_is_reset_only_when_another_compiled_impl_ran_last(monkeypatch):
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(compiling, "_last_compiled", [])
    assert [compiling.isolate(n) for n in ("a", "a", "b", "b", "a")] == [
        False,
        False,
        True,
        False,
        True,
    ]
    assert len(resets) == 2


@pytest.mark.slow
def test_a_compiled_flex_plugin_after_flex_compiles_its_own_code_and_agrees(tmp_path):
    plugin = tmp_path / "flex_copy.py"
    plugin.write_text(textwrap.dedent(FLEX_COPY))
    impls = plugins.discover([str(plugin)], entry_points=False)
    for case in (
        Case(1, 2, 1, 128, 128, 16, causal=True),
        Case(1, 2, 1, 128, 128, 16, mask="window", pattern="32", causal=True),
    ):
        rows = run_rows([impls["flex"], impls["flex_copy"]], case, settings=FAST)
        for name in ("flex", "flex_copy"):
            row = rows[name]
            assert row["status"] == "ok" and row["agrees"] is True, (name, row["reason"])
            # its first call compiled: it did not run the code flex compiled just before
            assert row["compile_ms"] > 0 and "reused code" not in (row["reason"] or "")
