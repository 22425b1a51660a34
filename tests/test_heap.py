"""The heap during a sweep (run/measuring/heap.py): a row's collection freezes what survives it
once a library was imported since the last freeze, and only then."""

import gc
import sys
import types

from attnbench.run.measuring import heap


def test_a_rows_collection_freezes_a_newly_imported_librarys_objects(monkeypatch):
    with heap.frozen():
        heap.collect()
        count = gc.get_freeze_count()
        keep = [[i] for i in range(1000)]  # noqa: F841 - alive through the collections below
        heap.collect()
        # nothing imported: nothing more frozen (the count may drop: a frozen object that
        # another thread lets go of is freed by reference counting)
        assert gc.get_freeze_count() < count + len(keep)
        library = types.ModuleType("attnbench_test_library")
        monkeypatch.setitem(sys.modules, "attnbench_test_library", library)
        heap.collect()
        assert gc.get_freeze_count() >= count + 1000
