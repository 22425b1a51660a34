"""The Ray executor on the CPU, on one local Ray instance shared by the module (start-up costs
seconds): same rows as the local executor, an actor killed mid-row, a row past --timeout, a
driver killed and resumed, and an unreachable cluster."""

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnbench.cli import main
from attnbench.errors import UsageError
from attnbench.run.executing.worker import WorkerSpec
from attnbench.run.measuring.row import failed_row
from attnbench.run.sweep import run_sweep
from attnbench.spec import Spec
from attnbench.store.results import read_results, row_key
from attnbench.store.schema import LOST

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
SMOKE = ["--device", "cpu", "--preset", "smoke", "--seq-len", "32", "--rep-ms", "2"]
SAME = ["naive", "sdpa", "f_raise", "f_nan"]
KEY = ["impl", "mode", "causal", "seq_q"]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance (2 CPUs); every sweep here joins it with --ray-address."""
    ray = pytest.importorskip("ray")
    from attnbench.run.executing import ray_cluster

    ray_cluster._quiet_raylet_notices()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _sweep(*args) -> int:
    return main(["sweep", "--no-progress", *args])


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The smoke grid on the local executor, then on two actors (with an impl that kills its
    actor on one case and one that hangs on another). The row timeout comes from the local
    run: no healthy row takes longer than that whole sweep of the same grid, however busy the
    machine, and the hang then costs no more than it must."""
    res = tmp_path_factory.mktemp("ray")
    plugins = ["--plugin", str(PLUGINS / "faulty.py"), "--plugin", str(PLUGINS / "ray_faults.py")]
    common = [*SMOKE, *plugins, "--results-dir", str(res), "--reports-dir", str(res / "rep")]
    started = time.perf_counter()
    local = [*common, "--impls", ",".join(SAME), "--no-isolate", "--no-report", "--run-id", "local"]
    assert _sweep(*local) == 0
    timeout = max(5, math.ceil(time.perf_counter() - started))
    assert (
        _sweep(
            *common,
            "--impls",
            ",".join([*SAME, "r_kill", "r_hang"]),
            "--executor",
            "ray",
            "--ray-address",
            cluster,
            "--ray-actors",
            "2",
            "--timeout",
            str(timeout),
            "--run-id",
            "ray",
        )
        == 0
    )
    return read_results(res / "ray"), read_results(res / "local"), res, timeout


def _outcomes(df):
    df = df[df["impl"].isin(SAME)]
    return sorted(df[[*KEY, "status", "agrees"]].astype(str).apply(tuple, axis=1))


@pytest.mark.slow  # two Ray actors and a local sweep of the same grid
def test_two_actors_give_the_rows_of_the_local_executor(runs):
    ray_rows, local_rows, res, _ = runs
    assert _outcomes(ray_rows) == _outcomes(local_rows)
    assert len(ray_rows) == 4 * 6 and not ray_rows.duplicated(KEY).any()
    assert ray_rows["host"].notna().all() and ray_rows["device_name"].notna().all()
    assert local_rows["host"].notna().all() and local_rows["device_name"].notna().all()
    env = json.loads((res / "ray" / "env.json").read_text())
    (entry,) = env["devices"].values()
    assert entry["actors"] == 2 and entry["ceilings"]["matmul_tflops"]["float32"] > 0
    ok = ray_rows[ray_rows["status"] == "ok"]
    assert ok["pct_peak"].notna().all()
    failed_rows = ray_rows[ray_rows["status"] != "ok"]
    assert failed_rows["time_ms"].isna().all() and failed_rows["pct_peak"].isna().all()


def test_an_actor_killed_mid_row_is_one_crash_row(runs):
    rows = runs[0][runs[0]["impl"] == "r_kill"]
    assert sorted(rows["status"]) == ["crash", "ok", "ok", "ok"]
    crash = rows[rows["status"] == "crash"].iloc[0]
    assert crash["causal"] and crash["mode"] == "fwd_bwd"
    assert crash["reason"].startswith("worker process died (killed by signal SIGKILL)")


def test_a_row_past_the_timeout_is_a_timeout_and_later_rows_run(runs):
    rows = runs[0][runs[0]["impl"] == "r_hang"]
    assert sorted(rows["status"]) == ["ok", "ok", "ok", "timeout"]
    hung = rows[rows["status"] == "timeout"].iloc[0]
    assert not hung["causal"] and hung["mode"] == "fwd"
    assert hung["reason"].startswith(f"no result after {runs[3]} s; the worker process was killed")


@pytest.mark.slow
def test_driver_killed_then_resumed_on_ray_completes_the_grid(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_SLOW_S", "0.1")
    grid = [
        "--device",
        "cpu",
        "--batch",
        "1",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--seq-len",
        "32,48,64",
        "--causal",
        "both",
        "--mode",
        "fwd",
        "--rep-ms",
        "2",
        "--impls",
        "naive,slow",
        "--plugin",
        str(PLUGINS / "slow.py"),
        "--executor",
        "ray",
        "--ray-address",
        cluster,
        "--ray-actors",
        "1",
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "killed",
    ]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--no-progress", *grid],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    csv_path = tmp_path / "killed" / "results.csv"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if csv_path.exists() and len(csv_path.read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(read_results(tmp_path / "killed"))
    assert 0 < partial < 12, "the kill must land part way through"

    assert _sweep(*grid, "--resume") == 0
    got = read_results(tmp_path / "killed")
    assert len(got) == 12 and not got.duplicated(KEY).any()
    assert (got["status"] == "ok").all()


def test_an_unreachable_cluster_is_one_line_exit_2_nothing_written(cluster, tmp_path, capsys):
    code = _sweep(
        *SMOKE,
        "--executor",
        "ray",
        "--ray-address",
        "127.0.0.1:1",
        "--results-dir",
        str(tmp_path / "res"),
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--ray-address 127.0.0.1:1: cannot connect" in err
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--executor", "ray", "--ray-address", "nowhere"], "give auto, HOST:PORT"),
        (["--executor", "ray", "--no-isolate"], "--no-isolate needs --executor local"),
    ],
)
def test_bad_ray_options_are_usage_errors(args, message, tmp_path, capsys):
    assert _sweep(*SMOKE, *args, "--results-dir", str(tmp_path / "res")) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


def test_without_ray_the_error_names_the_extra(monkeypatch):
    from attnbench.run.executing import ray_cluster

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError, match=r"pip install 'ray>=2.40'"):
        ray_cluster._import_ray()


class _Fake:
    """An executor that only records which families it ran."""

    def __init__(self, device_name):
        self.device_name, self.host, self.ran = device_name, "h", []
        self.where: dict = {}

    def run_case(self, case, impls, baseline=None):
        self.ran.append(case)
        return [failed_row(impl, case, "error", "fake") for impl in impls]

    def replace(self):
        return False

    def loss_detail(self):
        return ""

    def close(self):
        pass


def test_a_family_started_on_one_device_kind_stays_there(impls, tmp_path):
    cases = Spec.from_preset("smoke", "cpu", seq_len=[32, 64]).cases()
    naive = [impls["naive"]]
    first = next(c for c in cases if c.seq_q == 32)  # its family was started on "B"
    done = {row_key(failed_row(naive[0], first, "error", "x").row): "B"}
    a, b = _Fake("A"), _Fake("B")
    run_sweep(cases, naive, tmp_path, [a, b], run_id="r", seed=0, progress=False, done=done)
    family = [c for c in cases if c.mode == first.mode and c.causal == first.causal]
    assert [c for c in b.ran if c in family] == [c for c in family if c != first]
    assert not [c for c in a.ran if c in family]
    rows = read_results(tmp_path)  # every other family went to whichever lane was free
    assert len(rows) == len(cases) - 1 and set(rows["device_name"]) <= {"A", "B"}
    started = rows[(rows["mode"] == first.mode) & (rows["causal"] == first.causal)]
    assert set(started["device_name"]) == {"B"} and set(started["host"]) == {"h"}


@pytest.mark.ray
@pytest.mark.parametrize(
    "auth_env, needle",
    [
        ({}, "this process sent no token; run with RAY_AUTH_MODE=token"),
        (
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32},
            "the cluster refused this process's Ray token",
        ),
    ],
)
def test_a_cluster_that_wants_a_token_names_the_cause_and_the_fix(
    cluster, tmp_path, auth_env, needle
):
    """Ray >= 2.59 starts local clusters with token authentication; a driver that joins by
    address without RAY_AUTH_MODE=token (or with another token) gets the cause and the fix."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        pytest.skip("this Ray started the test cluster without token authentication")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sweep.py"), *SMOKE, "--executor", "ray"]
        + ["--ray-address", cluster, "--results-dir", str(tmp_path / "res")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, **auth_env},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "res").exists()


def test_one_actor_is_one_actor(monkeypatch):
    """--ray-actors 1 asks Ray for one actor and says 'ray: 1 actor up' (the actors' start
    itself is the fixture's two-actor run)."""
    from attnbench.run.executing import executors, ray_start

    asked = []

    def start(address, spec, actors, command):
        asked.append(actors)
        return [SimpleNamespace(device_name="AMD EPYC", host="vm", close=lambda: None)]

    monkeypatch.setattr(ray_start, "start", start)
    plan = SimpleNamespace(worker=WorkerSpec(), ray=(None, 1), command="attnbench sweep")
    pool = executors.start("ray", plan)
    pool._leave = None  # no cluster was joined
    with pool:
        assert asked == [1] and len(pool.executors) == 1
        assert re.fullmatch(r"ray: 1 actor up in \d+\.\d s \(AMD EPYC@vm\) on .+", pool.started)


class _Probe:
    """An executor that answers the device questions: ``device`` once its peer asks too (the
    actors start their worker processes at once), ``ceilings`` saying which thread asked."""

    def __init__(self, together: threading.Barrier, threads: list):
        self.together, self.threads = together, threads
        self.device_name, self.where, self.used = "AMD EPYC", {}, None

    def ask(self, what, *args):
        if what == "device":
            self.together.wait()  # times out (BrokenBarrierError) when asked one at a time
            return {"device_name": self.device_name, "host": "vm"}
        self.threads.append(threading.current_thread())
        return {"matmul_tflops": {"float32": 1.0}, "copy_gb_s": 10.0, "contended": False}

    def use_ceilings(self, ceilings):
        self.used = ceilings


def test_actors_start_at_once_and_measure_a_shared_cpu_one_after_another(tmp_path):
    from attnbench.run.executing.executors import Pool

    threads: list = []
    together = threading.Barrier(2, timeout=30)
    plan = SimpleNamespace(device="cpu", packages=(), dtypes=("float32",), quick=True)
    with Pool(plan, tempfile.TemporaryDirectory()) as pool:
        pool.executors = [_Probe(together, threads), _Probe(together, threads)]
        env = pool.measure_devices()
        assert env["devices"]["AMD EPYC"]["actors"] == 2
        assert all(p.used == env["ceilings"] for p in pool.executors)
        pool.executors = []
    assert threads == [threading.main_thread()] * 2  # the CPU's ceilings: one after another


class _Losing(_Fake):
    """A fake executor whose ``lose_at``-th case loses it (its first impl's row lost, the
    case's other rows never given); it cannot be replaced."""

    def __init__(self, device_name, host, lose_at=None):
        super().__init__(device_name)
        self.host, self.lose_at, self.replaced = host, lose_at, 0
        self.where = {"node": f"node-{host}", "actor": ord(host) - ord("a")}

    def run_case(self, case, impls, baseline=None):
        self.ran.append(case)
        if len(self.ran) == self.lose_at:
            yield failed_row(impls[0], case, LOST, "actor lost (its node died)")
            return
        yield from (failed_row(impl, case, "error", "fake") for impl in impls)

    def replace(self, say):
        self.replaced += 1
        return False


def _lost_grid(impls):
    return Spec.from_preset("smoke", "cpu", seq_len=[32, 64, 128]).cases(), [
        impls["naive"],
        impls["sdpa"],
    ]


def test_a_lost_executor_s_family_is_finished_by_the_survivor(impls, tmp_path):
    cases, two = _lost_grid(impls)
    a, b = _Losing("cpu", "a", lose_at=2), _Losing("cpu", "b")
    run_sweep(cases, two, tmp_path, [a, b], run_id="r", seed=0, progress=False)
    rows = read_results(tmp_path)
    assert len(rows) == len(cases) * 2 and not rows.duplicated(KEY).any()  # every row once
    lost = rows[rows["status"] == LOST]
    assert len(lost) == 1 and lost.iloc[0]["host"] == "a" and a.replaced == 1
    assert len(a.ran) == 2  # not replaced: its lane ended
    case = a.ran[1]  # the lost case's other impl, and the family's longer cases, ran on b
    family = rows[(rows["mode"] == case.mode) & (rows["causal"] == case.causal)]
    rest = family[(family["seq_q"] >= case.seq_q) & (family["status"] != LOST)]
    assert len(rest) == len(family[family["seq_q"] >= case.seq_q]) - 1 > 0
    assert set(rest["host"]) == {"b"} and set(rest["node"]) == {"node-b"}
    assert set(rows["actor"]) == {0, 1}  # each row says which actor ran it


def test_rows_no_executor_is_left_for_are_lost(impls, tmp_path):
    cases, two = _lost_grid(impls)
    run_sweep(
        cases, two, tmp_path, [_Losing("cpu", "a", lose_at=2)], run_id="r", seed=0, progress=False
    )
    rows = read_results(tmp_path)
    assert len(rows) == len(cases) * 2 and not rows.duplicated(KEY).any()
    assert (rows["status"] == LOST).sum() == len(cases) * 2 - 2  # all but its first case's
    assert rows["reason"].str.startswith("not run: every executor").sum() == len(cases) * 2 - 3


def test_a_lost_head_is_noticed_and_ends_with_the_resume_command(tmp_path, monkeypatch, capsys):
    """The head's port refusing is noticed by the watch; the sweep then ends with its own
    line, the summary of the rows written, and exit code 3 (EXIT_LOST)."""
    import socket
    import threading

    from attnbench import cli
    from attnbench.run.executing import ray_cluster
    from attnbench.run.planning.plan import Plan
    from attnbench.store.rundir import RunDir

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(ray_cluster, "HEAD_POLL_S", 0.01)
    monkeypatch.setattr(ray_cluster, "HEAD_LOST_S", 0.05)
    noticed = threading.Event()
    ray_cluster.watch_head(lambda a: noticed.set() if a == address else None, address)
    assert noticed.wait(30)
    # a watch ended with its sweep (the pool closed, a local instance shut down) calls nothing
    late = threading.Event()
    ray_cluster.watch_head(lambda a: late.set(), address).set()
    assert not late.wait(0.5)

    exits = []
    monkeypatch.setattr(cli.os, "_exit", exits.append)
    plan = Plan.__new__(Plan)
    plan.command, plan.impls = "sweep", []
    argv = ["--executor", "ray", "--ray-address", address]
    cli._head_lost(plan, argv, RunDir(tmp_path), "r1", named=False)(address)
    err = capsys.readouterr().err
    assert exits == [3] and err.count("\n") == 1
    assert f"head ({address}) stopped answering" in err
    assert err.strip().endswith(f"attnbench sweep {' '.join(argv)} --resume --run-id r1")


def test_actors_cancelled_by_a_cluster_without_tokens_name_the_cause(monkeypatch):
    from attnbench.run.executing.ray_cluster import actor_start_problem

    exc = RuntimeError("The actor 8f2c was cancelled before it started running.")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert "does not use token authentication" in actor_start_problem(exc)
    monkeypatch.setenv("RAY_AUTH_MODE", "")
    assert actor_start_problem(exc) is None  # not this process's doing: the actors were lost


def test_an_executor_slower_than_its_peers_is_flagged():
    import pandas as pd

    from attnbench.report.analyse.measurement import slow_peers
    from attnbench.report.render.checks import slow_peer_lines

    speeds = {("a", 0): 1.0, ("a", 1): 0.98, ("b", 2): 0.7, ("c", 3): 0.5}  # c: alone
    ok = pd.DataFrame(
        [
            {
                "device_name": "H" if host != "c" else "L",
                "host": host,
                "actor": actor,
                "speed_compute": s,
            }
            for (host, actor), s in speeds.items()
            for _ in range(3)
        ]
    )
    lines = slow_peer_lines(slow_peers(ok))
    assert len(lines) == 2 and lines[0].startswith("H at b 2 is slower than its peers")


class _Dying:
    """A fake Ray transport over this process's steps: its ``lose`` step (a step kind, and
    for a check its count) is lost as an actor whose node died is; it cannot be replaced."""

    def __init__(self, spec, number, lose=None):
        from attnbench.run.executing.local import InProcess

        self.inner, self.lose, self.checks = InProcess(spec), lose, 0
        self.host, self.device_name = f"node{number}", self.inner.device_name
        self.where = {"actor": number, "node": f"{number:08d}ffff"}

    def call(self, msg, timeout_s):
        from attnbench.run.executing.worker import WorkerFailed

        self.checks += msg[0] == "check"
        if self.lose in (msg[0], ("check", self.checks)):
            raise WorkerFailed(LOST, "actor lost (the node running it died)")
        return self.inner.call(msg, timeout_s)

    def replace(self, say):
        say("ray: no replacement for the fake actor")
        return False

    def loss_detail(self):
        """What a Ray actor's transport fetches after the loss was said: its stderr."""
        if self.on_detail is not None:
            self.on_detail()
        return "; stderr: planted last words"

    on_detail = None

    def close(self):
        self.inner.close()


def _fake_ray(monkeypatch, *loses):
    """The sweep command's executors: one _Dying transport per entry of ``loses``."""
    from attnbench.run.executing import executors
    from attnbench.run.executing.worker import Worker

    def start(kind, plan):
        pool = executors.Pool(plan, tempfile.TemporaryDirectory())
        spec = plan.worker
        pool.executors = [Worker(spec, _Dying(spec, n, lose)) for n, lose in enumerate(loses)]
        return pool

    monkeypatch.setattr(executors, "start", start)


TINY = ["--device", "cpu", "--impls", "naive,sdpa", "--seq-len", "32,64", "--rep-ms", "2"]
TINY += ["--preset", "smoke", "--mode", "fwd", "--causal", "false", "--no-report"]


def test_lost_rows_at_the_end_give_their_count_the_resume_command_and_exit_3(
    tmp_path, monkeypatch, capsys
):
    _fake_ray(monkeypatch, ("check", 2))  # lost at its second row: the rest is lost too
    args = [*TINY, "--results-dir", str(tmp_path), "--run-id", "r"]
    assert main(["sweep", *args]) == 3
    rows = read_results(tmp_path / "r")
    lost = int(rows["status"].eq(LOST).sum())
    assert 0 < lost and len(rows) == 4  # 2 impls x 2 lengths, each row once
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"attnbench sweep: {lost} row(s) lost with their executor (status lost, no number); "
        f"run them with: attnbench sweep {' '.join(args)} --resume"
    )
    # said when it happened, above the progress bar: who, the row, Ray's reason, what next
    (said,) = [line for line in err if line.startswith("lost: ")]
    assert said.startswith("lost: actor 0 on node0 (node 00000000), during sdpa: B1 H2 S32 D32")
    assert "(actor lost (the node running it died)); the rest of its family goes back" in said
    assert "ray: no replacement for the fake actor" in err
    _fake_ray(monkeypatch, None)
    assert main(["sweep", *args, "--resume"]) == 0  # the lost rows run, nothing is left lost
    assert not read_results(tmp_path / "r")["status"].eq(LOST).any()


def test_an_executor_lost_at_start_up_leaves_the_pool_and_the_sweep_goes_on(
    tmp_path, monkeypatch, capsys
):
    _fake_ray(monkeypatch, "device", None)  # actor 0's node dies while it describes its device
    assert main(["sweep", *TINY, "--results-dir", str(tmp_path), "--run-id", "r"]) == 0
    rows = read_results(tmp_path / "r")
    assert len(rows) == 4 and rows["status"].eq("ok").all() and set(rows["actor"]) == {1}
    err = capsys.readouterr().err
    assert "lost: actor 0 on node0 (node 00000000) while describing its device (actor lost " in err
    assert "going on with 1 executor" in err
    env = json.loads((tmp_path / "r" / "env.json").read_text())
    assert [w["actor"] for d in env["devices"].values() for w in d["where"]] == [1]


@pytest.mark.parametrize("step", ["device", "ceilings"])
def test_every_executor_lost_at_start_up_is_one_line_exit_3_nothing_written(
    tmp_path, monkeypatch, capsys, step
):
    _fake_ray(monkeypatch, step, step)
    assert main(["sweep", *TINY, "--results-dir", str(tmp_path), "--run-id", "r"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    doing = {"device": "describing", "ceilings": "measuring"}[step]
    err = [line for line in err if not line.startswith("warning: load average")]
    assert len(err) == 1, err  # one line, each executor's cause in it
    assert err[0].startswith(
        f"attnbench sweep: error: every executor was lost while {doing} its device, before the "
        f"first row (actor 0 on node0 (node 00000000): actor lost (the node running it died); "
        f"stderr: planted last words; actor 1 on node1 (node 00000001): actor lost"
    )
    assert err[0].endswith(
        "); nothing was written: check the cluster (ray status) and run the command again"
    )
    assert not (tmp_path / "r").exists()


def test_a_loss_in_a_cpu_round_taken_in_turns_is_said_at_once_with_its_cause_and_stderr(
    tmp_path, monkeypatch, capsys
):
    """The step that times a CPU case's impls in turns ('together') lost: the row says Ray's
    reason, the round, and the stderr fetched after the line said it (never 'not replaced'
    before a replacement was tried); one row is lost in flight, the rest of the family goes
    back (here to no one: 'not run')."""
    _fake_ray(monkeypatch, "together")
    said = []
    monkeypatch.setattr(_Dying, "on_detail", lambda self: said.append(capsys.readouterr().err))
    assert main(["sweep", *TINY, "--results-dir", str(tmp_path), "--run-id", "r"]) == 3
    rows = read_results(tmp_path / "r")
    assert len(rows) == 4 and rows["status"].eq(LOST).all(), rows[["impl", "status", "reason"]]
    lost = rows[~rows["reason"].str.startswith("not run: ")]
    assert len(lost) == 1 and lost.iloc[0]["reason"] == (
        "actor lost (the node running it died) (during timing round 1); stderr: planted last words"
    )
    assert len(said) == 1 and "lost: actor 0 on node0 (node 00000000), during " in said[0]


def _fake_actor(free: dict):
    """A RayActor on a fake Ray: its actor's step dies as on a lost node; the cluster has
    ``free`` resources."""
    ray = pytest.importorskip("ray")  # the GPU image has none

    from attnbench.run.executing.ray_executor import RayActor

    class Dead:
        class call:  # noqa: N801 - the actor method's shape: actor.call.remote(...)
            @staticmethod
            def remote(*args):
                return "ref"

    def get(ref, timeout=None):
        raise ray.exceptions.RayActorError()

    fake = SimpleNamespace(
        exceptions=ray.exceptions, get=get, kill=lambda *a, **k: None,
        available_resources=lambda: free, remote=None,
    )  # fmt: skip
    actor = RayActor(fake, {"num_cpus": 1}, WorkerSpec(), 1)
    actor.actor = Dead()
    return actor


def test_the_next_step_after_a_lost_actor_keeps_ray_s_reason_and_no_wait_without_room():
    from attnbench.run.executing.worker import WorkerFailed

    actor = _fake_actor({"CPU": 0.0})
    with pytest.raises(WorkerFailed) as first:
        actor.call(("check", None, None), None)
    assert first.value.status == LOST and first.value.reason.startswith("actor lost (")
    said = []
    started = time.monotonic()
    assert actor.replace(said.append) is False and time.monotonic() - started < 1
    assert said == [
        "ray: no replacement for actor 1: it needs 1 CPU and the cluster has CPU 0, GPU 0 "
        "free; its rows go to the other actors"
    ]
    with pytest.raises(WorkerFailed) as later:
        actor.call(("check", None, None), None)
    cause = first.value.reason.split("; stderr")[0]
    assert later.value.reason == f"the actor was lost ({cause}) and not replaced"


def _starting(monkeypatch, dying: set, actors: int) -> None:
    """ray_start.start on a fake Ray whose ``actors`` actors start, but those in ``dying``,
    whose node dies as they start (Ray's error names the node's address)."""
    ray = pytest.importorskip("ray")  # the GPU image has none

    from attnbench.run.executing import ray_start

    class Actor:
        def __init__(self, number):
            self.info = SimpleNamespace(remote=lambda: number)

    made = iter(range(actors))
    remote = SimpleNamespace(remote=lambda spec: Actor(next(made)))
    cls = SimpleNamespace(options=lambda **kw: remote)
    died = "The actor died.\n\tip: 10.0.0.2\nThe actor is dead because the node running it died."

    def get(ref, timeout=None):
        if ref in dying:
            raise ray.exceptions.RayActorError(error_msg=died)
        return {"host": f"h{ref}", "device_name": "cpu", "node_id": f"n{ref}", "err_path": ""}

    fake = SimpleNamespace(
        exceptions=ray.exceptions, remote=lambda c: cls, get=get, kill=lambda *a, **k: None,
        wait=lambda refs, num_returns, timeout: (refs, []),
        available_resources=lambda: {"CPU": float(actors)},
    )  # fmt: skip
    monkeypatch.setattr(ray_start, "connect", lambda address, command: fake)
    monkeypatch.setattr(ray_start, "actor_options", lambda *a: (actors, {"num_cpus": 1}))


def test_an_actor_whose_node_dies_as_it_starts_is_left_out_and_the_others_start(
    monkeypatch, capsys
):
    from attnbench.run.executing import ray_start

    _starting(monkeypatch, dying={1}, actors=3)  # actor 1's node died as it started
    up = ray_start.start(None, WorkerSpec(), None, "sweep")
    assert [p.where["actor"] for p in up] == [0, 2] and [p.host for p in up] == ["h0", "h2"]
    assert capsys.readouterr().err.strip().splitlines() == [
        "lost: actor 1 as it started on the node at 10.0.0.2 (the node running it died.); "
        "going on with 2 executors"
    ]


def test_every_actor_lost_as_it_started_is_one_line_exit_3(monkeypatch, capsys, tmp_path):
    """Once a usage error (exit 2) with Ray's long message: the cluster lost them."""
    _starting(monkeypatch, dying={0, 1}, actors=2)
    argv = [*TINY, "--executor", "ray", "--results-dir", str(tmp_path), "--run-id", "r"]
    assert main(["sweep", *argv]) == 3
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("warning: load")]
    assert err == [
        "attnbench sweep: error: every Ray actor was lost as it started (actor 0 on the node at "
        "10.0.0.2 (the node running it died.); actor 1 on the node at 10.0.0.2 (the node running "
        "it died.)); nothing was written: check the cluster (ray status) and run the command "
        "again"
    ]
    assert not (tmp_path / "r").exists()
