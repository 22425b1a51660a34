"""Testing attention impls with attnbench, for plugin authors and for attnbench's own tests.

    from attnbench import plugins
    from attnbench.testing import conformance_cases, run_row

    impl = plugins.discover(["my_attn.py"])["my_attn"]
    for case in conformance_cases(impl):
        row = run_row(impl, case)
        assert row["status"] == "unsupported" or row["agrees"], row["reason"]

- ``FAST``: settings that check a row and time it for about a millisecond: for correctness
  tests, not for measuring.
- ``run_row(impl, case)``: one row measured in this process, as a sweep measures it, by the
  sweep's own worker (run/executing/worker.py: the float64 reference, the agreement rule, the timing
  rounds interleaved with the speed anchor, the memory pass), and completed as a sweep
  completes it (run/complete.py: host, device, run id, seed, the machine's speed): the CSV
  row, every column of results.csv.
  ``run_rows(impls, case, baseline)``: a case's rows, timed in the same rounds, each paired
  with the ``baseline``'s (``speedup``).
- ``conformance_cases(impl)``: a small grid every impl is held to (GQA, causal in both
  alignments, a cross-length case, padding, a window, bfloat16, forward and backward), within
  the head dims, dtypes and GQA ``impl`` declares; an impl skips a case by its own reasons
  (``impl.reasons(case)``).
- ``registered()``: whatever is registered inside the block (impls, plugin files, mask
  kinds, score modifiers) is gone after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.masks import KINDS, MODS
from attnbench.measure.timing import TimerConfig
from attnbench.run.complete import Completer
from attnbench.run.executing.local import InProcess
from attnbench.run.executing.worker import Worker, WorkerSpec
from attnbench.run.measuring.row import Settings

FAST = Settings(TimerConfig(rep_ms=1.0, min_samples=1))
TEST_RUN_ID = "testing"  # the run_id of the rows measured here


def run_row(impl: registry.Impl, case: Case, seed: int = 0, settings: Settings = FAST) -> dict:
    """``impl``'s row of ``case``: status, reason, agreement and metrics, and what ran it,
    as results.csv has them (a failure is a row with its status and reason, never an
    exception)."""
    return run_rows([impl], case, seed=seed, settings=settings)[impl.name]


def run_rows(
    impls: list[registry.Impl],
    case: Case,
    baseline: registry.Impl | None = None,
    seed: int = 0,
    settings: Settings = FAST,
) -> dict[str, dict]:
    """Each impl's row of ``case`` by name, as a sweep's worker gives them and its completer
    completes them (its speed reference is this case), in this process (whose allocator is
    left as it is)."""
    settings = replace(settings, malloc_tunables=False)
    spec = WorkerSpec(seed=seed, settings=settings, device=case.device)
    worker, completer = Worker(spec, InProcess(spec)), Completer(None, TEST_RUN_ID, seed)
    rows = {}
    try:
        for measured in worker.run_case(case, impls, baseline):
            completer.complete(measured, worker.host, worker.device_name, worker.where)
            rows[measured.row["impl"]] = measured.row
    finally:
        worker.close()
    return rows


def conformance_cases(impl: registry.Impl | None = None, device: str = "cpu") -> list[Case]:
    """The grid every impl is held to, within what ``impl`` declares when given (its
    smallest head dim where it lists some, its first dtype where float32 is not among them,
    kv_heads = heads where it has no GQA; a module impl's at level layer, self-attention).
    Lengths of 64 and up: compiled CPU FlexAttention in torch 2.13 is wrong at some shorter
    lengths on AVX2 machines (docs/method.md)."""
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16, device=device)
    base["dtype"] = "float32"
    if impl is not None:
        if impl.head_dims and base["head_dim"] not in impl.head_dims:
            base["head_dim"] = min(impl.head_dims)
        if base["dtype"] not in impl.dtypes:
            base["dtype"] = impl.dtypes[0]
        if not impl.gqa:
            base["kv_heads"] = base["heads"]
    variants = [
        dict(mode="fwd_bwd"),
        dict(mode="fwd_bwd", causal=True),
        dict(seq_q=48, seq_kv=80, causal=True, causal_align="bottom_right"),
        dict(seq_q=80, seq_kv=48, mode="fwd_bwd"),
        dict(mask="padding", mode="fwd_bwd"),
        dict(mask="window", pattern="16", causal=True),
        dict(dtype="bfloat16", causal=True),
    ]
    if impl is not None and impl.module:  # a module runs at level layer, self-attention only
        base["level"] = "layer"
        variants = [v for v in variants if v.get("seq_q", 64) == v.get("seq_kv", 64)]
    return list(dict.fromkeys(Case(**{**base, **v}) for v in variants))


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """Registrations inside the block (impls, loaded plugin files, mask kinds, score
    modifiers) are undone after it; the built-ins are loaded first, as a module imported
    once never registers again."""
    plugins.discover()
    saved = dict(registry._IMPLS), set(plugins._LOADED), dict(KINDS), dict(MODS)
    try:
        yield
    finally:
        for live, before in zip((registry._IMPLS, plugins._LOADED, KINDS, MODS), saved):
            live.clear()
            live.update(before)
