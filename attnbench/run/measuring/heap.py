"""The Python heap during a sweep: the objects of start-up leave the garbage collector's view.

Every row ends with a full ``gc.collect()`` (row.release, and the memory pass starts with
one), so that tensors kept alive by reference cycles are freed before the next measurement.
A full collection walks every tracked object, and after start-up (torch, the impls'
libraries, torch.compile's modules: about 400,000 objects) one took 0.26-0.47 s on the
2-core CPU machine: most of a tiny row's cost. ``gc.freeze()`` moves the objects alive
after start-up into the permanent generation, which collections skip; a row's collection
then walks only what was made since (microseconds to milliseconds), and still frees every
cycle a row makes. Collecting only the young generations instead would be as cheap, but
would miss a row's cycles that an automatic collection had already promoted to the old
generation. benchmarks/row_cost.py measures the cost per row.

Libraries an impl imports at its first call (transformers: about 1,400 modules and 180,000
objects) would put a row's collection back at 0.2 s: ``collect`` freezes again what survives
a row's collection whenever modules were imported since the last freeze. What it freezes
then besides those modules (the case's inputs) is freed by reference counting as before;
only a reference cycle among them would be kept, until the sweep ends.
"""

from __future__ import annotations

import contextlib
import gc
import sys

_modules_frozen = [0]  # len(sys.modules) at the last freeze


def freeze_startup() -> None:
    """Collect once, then freeze what is left (the start-up's objects) for good."""
    gc.collect()
    gc.freeze()
    _modules_frozen[0] = len(sys.modules)


def collect() -> None:
    """A row's full collection; what survives it is frozen too when modules were imported
    since the last freeze (an impl's library, imported at its first call)."""
    gc.collect()
    if _modules_frozen[0] and len(sys.modules) != _modules_frozen[0]:
        gc.freeze()
        _modules_frozen[0] = len(sys.modules)


@contextlib.contextmanager
def frozen():
    """``freeze_startup`` for the duration of a block; the frozen objects are handed back to
    the collector afterwards, so a caller that goes on (a test process) keeps a normal heap.
    A heap frozen already (a worker process) stays as it is."""
    if _modules_frozen[0]:
        yield
        return
    freeze_startup()
    try:
        yield
    finally:
        gc.unfreeze()
        _modules_frozen[0] = 0
