"""Rows with no visible key (bottom-right causal with Sq > Skv: the first Sq - Skv queries see
no key) have output zero and gradients zero (docs/method.md), in every built-in impl that runs
on the CPU: exactly zero in those rows, and the harness's verdict (agreement.judge) agrees."""

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case
from attnbench.measure import agreement
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth

SHAPES = [(37, 1), (20, 8)]  # (seq_q, seq_kv): 36 and 12 keyless rows
BUILTIN = plugins.discover(entry_points=False)


def keyless_case(seq_q, seq_kv, mode):
    return Case(
        batch=2,
        heads=4,
        kv_heads=2,
        seq_q=seq_q,
        seq_kv=seq_kv,
        head_dim=16,
        causal=True,
        causal_align="bottom_right",
        mode=mode,
    )


def runnable():
    """(impl name, case) for every built-in the CPU runs on these cases; torch.compile'd
    impls (seconds per graph) are slow tests."""
    out = []
    for name, impl in sorted(BUILTIN.items()):
        for (sq, skv), mode in ((s, m) for s in SHAPES for m in ("fwd", "fwd_bwd")):
            case = keyless_case(sq, skv, mode)
            if impl.reasons(case):
                continue
            marks = [pytest.mark.slow] if impl.compiled else []
            out.append(pytest.param(name, case, id=f"{name}-{case.label()}", marks=marks))
    return out


def test_the_keyless_cases_cover_the_cpu_builtins():
    names = {p.values[0] for p in runnable()}
    assert {"naive", "naive_compiled", "sdpa", "sdpa_math", "sdpa_flash", "tiled", "flex"} <= names


@pytest.mark.parametrize("name,case", runnable())
def test_rows_with_no_visible_key_are_zero_and_agree(name, case):
    impl = BUILTIN[name]
    inputs = make_inputs(case, 0)
    out, grads = Call.prepare(impl, case, inputs).check()
    empty = case.seq_q - case.seq_kv  # rows 0 .. empty - 1 see no key
    assert torch.equal(out[:, :, :empty], torch.zeros_like(out[:, :, :empty]))
    assert out[:, :, empty:].abs().sum() > 0
    if grads is not None:
        dq, dk, dv = grads
        assert torch.equal(dq[:, :, :empty], torch.zeros_like(dq[:, :, :empty]))
        assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    truth = ground_truth(case, inputs)
    got = [out, *(grads or ())]
    verdict = agreement.judge(case, got, truth)
    assert verdict.agrees, verdict.notes
