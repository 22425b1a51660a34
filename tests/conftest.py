import os
import tempfile

import pytest
import torch

# torch.compile's caches private to this test run, so that other processes compiling on the
# same machine can never hand it a kernel built for other settings
# (one per test process: parallel workers inherit the first process's environment)
if "PYTEST_XDIST_WORKER" in os.environ or "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-inductor-")


def _threads_per_worker() -> int | None:
    """Parallel test processes (pytest-xdist) share the cores: each gets cores // workers torch
    threads, at least one (None outside xdist, or where OMP_NUM_THREADS is set already). Two
    workers each running two OpenMP threads on two cores spin-wait on one another: small CPU
    calls then take ten to twenty times as long."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // workers)


# the sweeps, worker processes and Ray actors the tests start inherit it (this process's own
# torch is set in pytest_configure)
if (_threads := _threads_per_worker()) is not None:
    os.environ["OMP_NUM_THREADS"] = str(_threads)
from attnbench import plugins, testing  # noqa: E402
from attnbench.run import heap  # noqa: E402


def pytest_configure(config):
    """The test process's torch threads (``_threads_per_worker``); the built-ins loaded and the
    heap frozen once per test process, as a worker process does (run/heap.py): each row's
    garbage collection then skips torch and the impls' libraries."""
    if _threads is not None:
        torch.set_num_threads(_threads)
    plugins.discover()
    heap.freeze_startup()


@pytest.fixture(scope="session")
def impls():
    return plugins.discover()


@pytest.fixture
def registered():
    """Whatever the test registers (impls, plugin files, mask kinds, score modifiers) is gone
    after it (attnbench.testing.registered)."""
    with testing.registered():
        yield


# the test files that take longest on 2 CPU cores (their module fixtures run whole sweeps and
# reports: `pytest --durations`), longest first. They are handed out first (pyproject's addopts:
# --dist loadfile --no-loadscope-reorder), so that the parallel workers finish together: last,
# one would run alone for a minute. A file missing here only runs in its usual order.
LONGEST_FIRST = (
    "test_documented_commands.py",
    "test_ray.py",
    "test_cli_smoke.py",
    "test_faults.py",
    "test_rounds_report.py",
    "test_accuracy_calibration.py",
    "test_rounds.py",
    "test_triton_hopper.py",
    "test_mask_kinds.py",
    "test_report.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as found
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _run_in_a_temporary_folder(tmp_path, monkeypatch):
    """Sweeps write results/ and reports/ relative to the working folder: keep them out of the
    repository."""
    monkeypatch.chdir(tmp_path)
