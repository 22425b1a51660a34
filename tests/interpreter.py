"""Triton's CPU interpreter for the kernel test modules (test_triton_flash.py,
test_triton_hopper.py). Import this only after the module has set TRITON_INTERPRET (it imports
triton).

``broken_reason()``: some triton and numpy pairs cannot interpret a loop with a runtime bound,
which every kernel here has (triton 3.6 with numpy 2.5, the lent GPU image's pair: ``int()`` of
a one-element array; fixed in triton 3.7). The interpreted tests then skip with this reason
rather than fail for the interpreter's bug (the kernels are unaffected on a GPU); the module's
other tests still run.

``kernel_tests(in_process, broken)``: the decorator of those tests (``interpreted`` marker).

``run_child(path)``: the module's ``interpreted`` tests again in a subprocess with
TRITON_INTERPRET=1, for a process in which triton was already imported without it (or a GPU is
visible). A child whose whole module skipped itself (pytest's exit code 5: no test ran) is a
skip here with the child's reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent


@triton.jit
def _loop_bound_probe(X, N):
    total = tl.zeros([1], tl.float32)
    for _ in range(0, N):  # a runtime loop bound, as every kernel here has
        total += 1.0
    tl.store(X + tl.arange(0, 1), total)


def interpreter_problem() -> str | None:
    """None when the interpreter takes runtime loop bounds, else what goes wrong."""
    x = torch.zeros(1)
    try:
        _loop_bound_probe[(1,)](x, 3)
    except Exception as exc:  # noqa: BLE001 - any failure of the probe is the answer
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None if x.item() == 3.0 else f"the probe loop ran {x.item():g} times, not 3"


def broken_reason() -> str | None:
    """The skip reason of the interpreted tests when this interpreter cannot run them."""
    import numpy as np

    problem = interpreter_problem()
    if not problem:
        return None
    return (
        f"triton {triton.__version__}'s CPU interpreter cannot run a loop with a runtime bound "
        f"under numpy {np.__version__} (a Triton bug fixed in triton 3.7; the kernels "
        f"themselves are unaffected on a GPU): {problem}"
    )


def kernel_tests(in_process: bool, broken: str | None):
    """The decorator of a module's kernel tests: run where this process interprets
    (``in_process``), else skipped here and run by ``run_child``'s child, which selects them
    by their ``interpreted`` marker; skipped with ``broken`` where the interpreter cannot."""
    skip = pytest.mark.skipif(
        not in_process or broken is not None,
        reason=broken or "run by test_interpreted_in_subprocess",
    )
    return lambda test: pytest.mark.interpreted(skip(test))


def run_child(path: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "ATTNBENCH_INTERPRET_CHILD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider"]
    cmd += ["-m", "interpreted and not slow"]  # the module's other tests ran in the parent
    proc = subprocess.run(
        [*cmd, path], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    lines = proc.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    if proc.returncode in (0, 5) and "passed" not in last:  # the whole module skipped itself
        reasons = [ln for ln in lines if ln.startswith("SKIPPED")]
        pytest.skip(reasons[0] if reasons else last or "the child ran no test")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in last, proc.stdout[-2000:]
