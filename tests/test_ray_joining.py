"""Which Ray cluster a sweep joins, and what it says while it waits: RAY_ADDRESS is joined as
--ray-address is (a dead one is one line, exit 2, within seconds); without either, a private
Ray instance, never a cluster that `ray start` left running; on a cluster without the CPUs
free, a line saying what it waits for, at once. Against real Ray instances on this machine.
The slow test runs with: python -m pytest -m slow -n 0 tests/test_ray_joining.py"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from attnbench.store.results import read_results

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--device", "cpu", "--preset", "smoke", "--impls", "naive", "--seq-len", "32"]
TINY += ["--mode", "fwd", "--causal", "false", "--rep-ms", "1", "--executor", "ray"]
TINY += ["--no-report", "--no-progress"]
WAITING = "ray: waiting up to 300 s for Ray to place and start 1 of 1 actors (1 CPU each)"


def _env(**extra) -> dict:
    """This environment without RAY_ADDRESS, Python's warnings off, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONWARNINGS": "ignore", **extra}


def _sweep(tmp_path, run_id: str, *args, env=None, **kw):
    cmd = [sys.executable, str(ROOT / "scripts" / "sweep.py"), *TINY, *args]
    cmd += ["--results-dir", str(tmp_path), "--run-id", run_id]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env(), **kw
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
def test_a_dead_ray_address_in_the_environment_is_one_line_exit_2_within_seconds(tmp_path):
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    proc = _sweep(tmp_path, "r", env=_env(RAY_ADDRESS=address))
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - started < 60, "Ray's retries again"
    assert proc.returncode == 2, err[-2000:]
    assert err.count("\n") == 1 and f"RAY_ADDRESS={address}: cannot connect" in err, err
    assert not (tmp_path / "r").exists()


@pytest.fixture
def ray_started(monkeypatch):
    """A one-CPU cluster left running as `ray start` leaves one: its address in the Ray
    temp folder's ray_current_cluster, where Ray's ``ray.init()`` looks for a cluster to join
    (in a temp folder of its own, RAY_TMPDIR, so that no other Ray user here finds it); this
    process joins it too, to hold its CPU. Shut down, its processes by their handles, at the
    end."""
    ray = pytest.importorskip("ray")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    tmp = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # short: Ray's socket paths
    monkeypatch.setenv("RAY_TMPDIR", str(tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        (tmp / "ray").mkdir(exist_ok=True)
        (tmp / "ray" / "ray_current_cluster").write_text(cluster.address)  # as `ray start`
        ray.init(address=cluster.address, log_to_driver=False)
        yield ray, cluster.address, _env(RAY_TMPDIR=str(tmp))
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.ray
def test_a_sweep_starts_a_private_instance_and_says_what_it_joined_and_waits_for(
    tmp_path, ray_started
):
    ray, address, env = ray_started
    head = ray.get_runtime_context().get_node_id()
    private = _sweep(tmp_path, "private", env=env)  # no address: not the running cluster
    out, err = private.communicate(timeout=300)
    assert private.returncode == 0, err[-3000:]
    assert "on a private Ray instance started here (no --ray-address or RAY_ADDRESS)" in out
    assert head not in set(read_results(tmp_path / "private")["node"])

    @ray.remote(num_cpus=1)
    class Holder:  # another job's actor, holding the cluster's one CPU
        def ready(self):
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote(), timeout=120)
    joined = _sweep(tmp_path, "joined", "--ray-address", address, env=env)
    said, deadline = "", time.monotonic() + 120
    while WAITING not in said and time.monotonic() < deadline and joined.poll() is None:
        said += joined.stderr.readline()
    assert WAITING + ": the cluster has CPU 0, GPU 0 free, other jobs hold the rest" in said, said
    ray.kill(holder)  # the CPU is free: the sweep's actor is placed, the sweep goes on
    out, err = joined.communicate(timeout=300)
    assert joined.returncode == 0, (said + err)[-3000:]
    assert f"on the cluster at {address} (--ray-address)" in out, out
    assert set(read_results(tmp_path / "joined")["node"]) == {head}
