"""torch.compile for benchmarking, and counting compile events.

``compile_events()`` grows whenever dynamo compiles a frame (a first compile or a recompile)
or inductor compiles a graph (including a backward graph, compiled lazily at the first
backward). The sweep reads it (``Watch``) around the first call (did it compile? ->
``compile_ms``) and around the timing pass (did anything recompile while being timed? ->
recompiled).

``isolate(name)`` runs before each row of a torch.compile impl: when another compiled impl
ran last in this process it resets dynamo (``torch._dynamo.reset()``), so that no impl runs,
or is timed with, code compiled by another (two impls compiling the same function, e.g.
``flex_attention``, would otherwise share dynamo's cache and its recompile state). An impl's
own compiled code is kept from row to row.

``eagerly(fn)`` is ``fn`` with torch.compile switched off: the eager form of every impl
registered ``compiled=True``, which the diagnosis of a disagreeing row runs (measure/diagnose.py).
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable

import torch

# Each new shape, dtype or scale is a new graph; a sweep has many. Past dynamo's limit it
# would silently run the function eagerly, and the row would time eager code under a
# compiled name; so the limit is raised and hitting it anyway is an error.
RECOMPILE_LIMIT = 256


def compile_events() -> int:
    if "torch._dynamo" not in sys.modules:  # nothing has compiled in this process
        return 0
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    inductor = sum(n for key, n in counters["inductor"].items() if key.startswith("fxgraph_cache_"))
    return counters["frames"]["total"] + counters["aot_autograd"]["total"] + inductor


def compile_static(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=False)``: one specialised graph per shape, as a benchmark
    of the best case wants, with the recompile limit raised (see RECOMPILE_LIMIT). Made at
    the first call: importing torch.compile's machinery takes seconds, which a process that
    never runs a compiled impl (the CLI, a worker of a sweep without one) does not pay."""
    compiled: list[Callable] = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not compiled:
            import torch._dynamo.config as dynamo_config

            for name in ("recompile_limit", "accumulated_recompile_limit"):
                if getattr(dynamo_config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
                    setattr(dynamo_config, name, RECOMPILE_LIMIT)
            if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
                dynamo_config.fail_on_recompile_limit_hit = True
            compiled.append(torch.compile(fn, dynamic=False))
        return compiled[0](*args, **kwargs)

    return run


def eagerly(fn: Callable) -> Callable:
    """``fn`` run with torch.compile switched off (``torch.compiler.set_stance("force_eager")``):
    every function compiled with torch.compile runs as plain PyTorch (FlexAttention its
    unfused form), nothing is compiled, and the code compiled before stays for the next
    compiled call. So an impl that uses torch.compile has an eager form with nothing to
    declare. Warnings are silenced (FlexAttention warns that it runs uncompiled)."""

    def run(*args, **kwargs):
        with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)

    return run


class Watch:
    """``with Watch() as w: ...``: ``w.compiled`` says whether anything compiled (or
    recompiled) inside the block."""

    compiled = False

    def __enter__(self) -> Watch:
        self._before = compile_events()
        return self

    def __exit__(self, *exc) -> None:
        self.compiled = compile_events() != self._before


RECOMPILED_NOTE = "recompiled during the timing pass: time_ms includes compilation"


def compile_ms(compiled: bool, first_ms: float, again_ms: Callable[[], float], notes) -> float:
    """A compiled impl's compile_ms: when its first call (``first_ms``) compiled, its extra
    time over a second call (``again_ms()``); else 0, and ``notes`` says why."""
    if compiled:
        return first_ms - again_ms()
    notes.append(
        "compile_ms 0: the first call compiled nothing (it reused code it compiled for an "
        "earlier row)"
    )
    return 0.0


_last_compiled: list[str] = []  # the compiled impl whose row ran last in this process


def isolate(name: str) -> bool:
    """Before a row of compiled impl ``name``: forget what other compiled impls compiled in
    this process. Returns whether dynamo was reset."""
    reset = bool(_last_compiled) and _last_compiled[0] != name
    if reset:
        import torch._dynamo

        torch._dynamo.reset()
    _last_compiled[:] = [name]
    return reset
