import json
import os
import tempfile
from pathlib import Path

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
from attnbench.run.measuring import heap  # noqa: E402


def pytest_configure(config):
    """The test process's torch threads (``_threads_per_worker``); the built-ins loaded and the
    heap frozen once per test process, as a worker process does (run/measuring/heap.py): each row's
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


# The test files are handed out longest first (pyproject's addopts: --dist loadfile
# --no-loadscope-reorder), so that the parallel workers finish together: last, one would run
# alone for a minute. Each file's seconds come from the last run in this checkout (pytest's
# cache, written after every run), else from DURATIONS (written by a full run with
# --store-durations); a file in neither runs in its usual order.
DURATIONS = Path(__file__).with_name("durations.json")
CACHE_KEY = "attnbench/file_seconds"


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test file's seconds to {DURATIONS.name} (the order of a fresh run)",
    )


def file_seconds(config) -> dict[str, float]:
    """Each test file's seconds in the last run that timed it."""
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    cached = cache.get(CACHE_KEY, None) if cache else None
    if cached:
        return cached
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """A test's phases (setup, call, teardown) add to its file's seconds."""
    name = report.nodeid.split("::")[0]  # its file, from the repository's root
    _SECONDS[name] = _SECONDS.get(name, 0.0) + report.duration


def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER") or not _SECONDS:
        return  # the controller (or a run without xdist) keeps the seconds
    config = session.config
    seconds = {**file_seconds(config), **{k: round(v, 1) for k, v in _SECONDS.items()}}
    seconds = {k: v for k, v in seconds.items() if (config.rootpath / k).is_file()}  # not gone
    if getattr(config, "cache", None):
        config.cache.set(CACHE_KEY, seconds)
    if config.getoption("store_durations"):
        DURATIONS.write_text(json.dumps(dict(sorted(seconds.items())), indent=1) + "\n")


def pytest_collection_modifyitems(config, items):
    seconds = file_seconds(config)
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable
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
