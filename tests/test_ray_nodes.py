"""The Ray executor on two nodes of one machine (a head and a second raylet, on loopback,
started by Ray's own test cluster): the worker node killed inside a row costs that row
(``lost``, said at once, its stderr added), its family is finished by the surviving actor,
every row is written once, no actor's stderr file is left behind, and --resume runs the lost
row only; the head killed mid-sweep ends the sweep with attnbench's own line and exit code 3.
Both are slow (minutes on two cores): python -m pytest -m slow -n 0 tests/test_ray_nodes.py"""

import glob
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from attnbench.store.results import read_results
from attnbench.store.schema import LOST

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
GRID = ["--device", "cpu", "--preset", "smoke", "--seq-len", "32,64,128", "--rep-ms", "2"]
GRID += ["--executor", "ray", "--no-report", "--no-progress"]
KEY = ["impl", "mode", "causal", "seq_q"]
SWEEP_S = 480  # the whole sweep
SAID_S = 8.0  # the loss said within this of the kill (its stderr, fetched after, took 10 s)
LITTER = os.path.join(tempfile.gettempdir(), "attnbench-ray-actor-*.err")


def _command(address: str, tmp_path, *extra: str) -> list[str]:
    """The sweep command on the cluster at ``address``."""
    args = [*GRID, *extra, "--ray-address", address, "--results-dir", str(tmp_path)]
    return [sys.executable, str(ROOT / "scripts" / "sweep.py"), *args, "--run-id", "r"]


def _start(cmd: list[str], env=None):
    """``cmd`` in a subprocess, its stderr read line by line with the time each came."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.monotonic(), x) for x in proc.stderr), daemon=True
    )
    reader.start()
    return proc, lines, reader


def _rows_written(tmp_path) -> int:
    results = tmp_path / "r" / "results.csv"
    return len(results.read_text().splitlines()) - 1 if results.exists() else 0


def _inside_a_call_on(raylet_pid: int, inside: Path) -> bool:
    """Whether a call of the slow impl is in progress in a process under ``raylet_pid`` (an
    actor's worker process: its parent is the actor, whose parent is the node's raylet)."""
    import psutil

    for mark in inside.iterdir():
        try:
            parents = psutil.Process(int(mark.name)).parents()
        except (psutil.Error, ValueError):
            continue
        if any(p.pid == raylet_pid for p in parents):
            return True
    return False


@pytest.mark.slow
@pytest.mark.ray
def test_a_worker_node_killed_mid_row(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    from ray._private import ray_constants

    litter = set(glob.glob(LITTER))
    inside = tmp_path / "inside"
    inside.mkdir()
    env = {**os.environ, "ATTNBENCH_SLOW_INSIDE": str(inside), "ATTNBENCH_SLOW_S": "0.05"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        raylet = worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        plugin = ["--plugin", str(PLUGINS / "slow.py"), "--impls", "naive,slow"]
        cmd = _command(cluster.address, tmp_path, *plugin)
        proc, lines, reader = _start(cmd, env)
        deadline = time.monotonic() + SWEEP_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _rows_written(tmp_path) >= 2 and _inside_a_call_on(raylet, inside):
                break
            time.sleep(0.05)
        killed = time.monotonic()
        cluster.remove_node(worker, allow_graceful=False)
        proc.wait(timeout=SWEEP_S)
        reader.join(timeout=30)
        rows = _check_the_loss(proc, lines, killed, tmp_path)
        assert set(glob.glob(LITTER)) <= litter, "an actor's stderr file was left behind"
        again = subprocess.run(
            [*cmd, "--resume"], capture_output=True, text=True, timeout=SWEEP_S, env=env
        )
    finally:
        cluster.shutdown()
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = read_results(tmp_path / "r")  # the lost row alone ran again
    assert len(resumed) == 24 and not resumed.duplicated(KEY).any()
    assert (resumed["status"] == "ok").all()
    assert resumed.iloc[:-1].equals(rows[rows["status"] != LOST].reset_index(drop=True))


def _check_the_loss(proc, lines: list, killed: float, tmp_path):
    """One row lost, said at once, with its stderr; the survivor is the node that is not the
    lost row's, only it wrote rows after the loss, and the lost family's later rows are its.
    Returns the rows."""
    err = "".join(x for _, x in lines)
    assert proc.returncode == 3, err[-3000:]  # a row lost: the resume command, exit 3
    assert err.strip().splitlines()[-1].endswith("--run-id r --resume"), err[-3000:]
    assert "1 row(s) lost with their executor" in err and "ray: no replacement for actor" in err
    (said,) = [t for t, x in lines if x.startswith("lost: actor ")]
    assert said - killed < SAID_S, f"the loss was said {said - killed:.1f} s after the kill"
    rows = read_results(tmp_path / "r")
    assert len(rows) == 12 * 2 and not rows.duplicated(KEY).any(), err[-3000:]
    assert rows["node"].notna().all() and rows["actor"].notna().all()
    (at,) = rows.index[rows["status"] == LOST]  # the row in flight on the killed node
    lost = rows.loc[at]
    assert (rows["status"] == "ok").sum() == 23, err[-3000:]
    assert "actor lost" in lost["reason"] and "; stderr: " in lost["reason"]
    assert "not replaced" not in lost["reason"], lost["reason"]
    (survivor,) = set(rows["node"]) - {lost["node"]}  # the node that is not the lost row's
    assert (rows.loc[at + 1 :, "node"] == survivor).all()  # only it wrote rows after the loss
    family = rows[(rows["mode"] == lost["mode"]) & (rows["causal"] == lost["causal"])]
    later = family[family["seq_q"] > lost["seq_q"]]
    assert (later["node"] == survivor).all(), family[["impl", "seq_q", "node"]]
    return rows


@pytest.mark.slow
@pytest.mark.ray
def test_a_head_killed_mid_sweep_ends_with_its_own_line_and_exit_3(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        proc, lines, reader = _start(_command(cluster.address, tmp_path, "--impls", "naive,sdpa"))
        deadline = time.monotonic() + SWEEP_S
        while time.monotonic() < deadline and proc.poll() is None and _rows_written(tmp_path) < 4:
            time.sleep(0.5)
        cluster.remove_node(cluster.head_node, allow_graceful=False)
        proc.wait(timeout=SWEEP_S)
        reader.join(timeout=30)
    finally:
        cluster.shutdown()
    err = "".join(x for _, x in lines)
    assert proc.returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "the Ray cluster's head" in last and last.endswith("--run-id r --resume"), err[-3000:]
    rows = read_results(tmp_path / "r")
    assert 3 <= len(rows) < 24 and not rows.duplicated(KEY).any()
