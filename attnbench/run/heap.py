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
"""

from __future__ import annotations

import contextlib
import gc


def freeze_startup() -> None:
    """Collect once, then freeze what is left (the start-up's objects) for good."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def frozen():
    """``freeze_startup`` for the duration of a block; the frozen objects are handed back to
    the collector afterwards, so a caller that goes on (a test process) keeps a normal heap."""
    freeze_startup()
    try:
        yield
    finally:
        gc.unfreeze()
