"""The Ray executor on two nodes of one machine (a head and a second raylet, on loopback,
started by Ray's own test cluster): the worker node killed mid-sweep costs the row in flight
(``lost``), its family is finished by the surviving actor, every row is written once, and
--resume runs the lost rows only; the head killed mid-sweep ends the sweep with attnbench's
own line and exit code 3. Slow: minutes on two cores."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.store.results import read_results
from attnbench.store.schema import LOST

ROOT = Path(__file__).resolve().parent.parent
GRID = ["--device", "cpu", "--preset", "smoke", "--seq-len", "32,64,128", "--rep-ms", "2"]
GRID += ["--impls", "naive,sdpa", "--executor", "ray", "--no-report", "--no-progress"]
KEY = ["impl", "mode", "causal", "seq_q"]
SWEEP_S = 480  # the whole sweep


def _sweep_past_its_fourth_row(address: str, tmp_path):
    """The sweep command on the cluster at ``address``, started in a subprocess; returns once
    results.csv holds four rows (or the sweep ended, or SWEEP_S passed)."""
    args = [*GRID, "--ray-address", address, "--results-dir", str(tmp_path)]
    cmd = [sys.executable, str(ROOT / "scripts" / "sweep.py"), *args, "--run-id", "r"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = tmp_path / "r" / "results.csv"
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) > 4:
            break
        time.sleep(0.5)
    return cmd, proc


@pytest.mark.slow
@pytest.mark.ray
def test_a_worker_node_killed_mid_sweep(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        cmd, proc = _sweep_past_its_fourth_row(cluster.address, tmp_path)
        cluster.remove_node(worker, allow_graceful=False)
        out, err = proc.communicate(timeout=SWEEP_S)
        assert proc.returncode == 3, err[-3000:]  # a row lost: the resume command, exit 3
        assert err.strip().splitlines()[-1].endswith("--run-id r --resume"), err[-3000:]
        assert "1 row(s) lost with their executor" in err and "\nlost: actor " in err
        assert "ray: no replacement for actor" in err  # said, and not waited for
        rows = read_results(tmp_path / "r")
        assert len(rows) == 12 * 2 and not rows.duplicated(KEY).any(), err[-3000:]
        lost = rows[rows["status"] == LOST]  # the row in flight on the killed node
        assert len(lost) == 1 and (rows["status"] == "ok").sum() == 23, err[-3000:]
        assert rows["node"].notna().all() and rows["actor"].notna().all()
        head = rows.iloc[-1]["node"]  # the survivor ran the last rows, the lost family's too
        case = lost.iloc[0]
        family = rows[(rows["mode"] == case["mode"]) & (rows["causal"] == case["causal"])]
        later = family[(family["seq_q"] > case["seq_q"])]
        assert (later["node"] == head).all() and case["node"] != head
        again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=SWEEP_S)
        assert again.returncode == 0, again.stderr[-3000:]
        resumed = read_results(tmp_path / "r")  # the lost row alone ran again
        assert len(resumed) == 24 and not resumed.duplicated(KEY).any()
        assert (resumed["status"] == "ok").all()
        assert resumed.iloc[:-1].equals(rows[rows["status"] != LOST].reset_index(drop=True))
    finally:
        cluster.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_a_head_killed_mid_sweep_ends_with_its_own_line_and_exit_3(tmp_path):
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cmd, proc = _sweep_past_its_fourth_row(cluster.address, tmp_path)
        cluster.remove_node(cluster.head_node, allow_graceful=False)
        out, err = proc.communicate(timeout=SWEEP_S)
    finally:
        cluster.shutdown()
    assert proc.returncode == 3, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "the Ray cluster's head" in last and last.endswith("--run-id r --resume"), err[-3000:]
    rows = read_results(tmp_path / "r")
    assert 3 <= len(rows) < 24 and not rows.duplicated(KEY).any()
