import os
import tempfile

import pytest
import torch

# torch.compile's caches private to this test run, so that other processes compiling on the
# same machine can never hand it a kernel built for other settings
# (one per test process: parallel workers inherit the first process's environment)
if "PYTEST_XDIST_WORKER" in os.environ or "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-inductor-")

from attnbench import registry, testing  # noqa: E402
from attnbench.run import heap  # noqa: E402


def pytest_configure(config):
    """The built-ins loaded and the heap frozen once per test process, as a worker process
    does (run/heap.py): each row's garbage collection then skips torch and the impls'
    libraries."""
    registry.discover()
    heap.freeze_startup()


@pytest.fixture(scope="session")
def impls():
    return registry.discover()


@pytest.fixture
def registered():
    """Whatever the test registers (impls, plugin files, mask kinds, score modifiers) is gone
    after it (attnbench.testing.registered)."""
    with testing.registered():
        yield


def pytest_collection_modifyitems(config, items):
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
