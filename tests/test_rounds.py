"""The worker's case protocol: a case's impls and the speed anchor timed in interleaved rounds,
the order rotated each round, each sample's round kept; a crash or a hang inside the rounds
costs that impl's row only; speedups paired by round against the run's baseline; the speed
anchor relative to the run's start, kept across --resume."""

import itertools
import json
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.measure.paired import ratio, round_medians
from attnbench.measure.timing import ROUNDS, Slice, TimerConfig
from attnbench.registry import Impl
from attnbench.run.executing.local import InProcess, Subprocess
from attnbench.run.executing.worker import (
    ANCHOR,
    PREPARING,
    UNPREPARED,
    Worker,
    WorkerFailed,
    WorkerSpec,
)
from attnbench.run.measuring.failed import Measured, base_row, failed_row
from attnbench.run.measuring.row import Settings
from attnbench.run.sweep import run_sweep
from attnbench.store.results import done_keys, read_results, row_writer
from attnbench.store.rundir import RunDir
from attnbench.store.schema import LOST
from attnbench.testing import FAST, run_row, run_rows

PLUGINS = Path(__file__).resolve().parent / "plugins"
CASE = Case(batch=1, heads=1, kv_heads=1, seq_q=32, seq_kv=32, head_dim=16)


def _impl(name: str) -> Impl:
    return Impl(name=name, fn=lambda q, k, v, *, causal, scale: q)


class _Script:
    """A transport that answers every step at once and records it; ``fail`` maps a step
    (kind, impl name, round) to the WorkerFailed it raises, after which the server is fresh
    (it answers UNPREPARED until it gets the case again)."""

    host, device_name = "h", "d"

    def __init__(self, fail: dict | None = None):
        self.sent, self.fail, self.fresh = [], fail or {}, False

    def call(self, msg, timeout_s):
        kind, *args = msg
        self.sent.append(msg)
        group = args[1] if kind == "together" else [args[1]] if kind == "time" else []
        keys = [("time", who.name, args[2]) for who in group]  # a shared step fails with any
        if not group:  # a step of its own: (kind, the impl it names, None)
            keys.append((kind, getattr(args[1], "name", None) if len(args) > 1 else None, None))
        for key in keys:
            if key in self.fail:
                self.fresh = True
                raise self.fail[key]
        if kind == "prepare":
            self.fresh = False
        elif self.fresh:
            return UNPREPARED
        if kind == "time":
            return Slice(args[2], (1.0 + args[2],))
        if kind == "together":
            return {who.name: Slice(args[2], (1.0 + args[2],)) for who in args[1]}
        if kind == "anchor":
            return {"t_unix": 0.0, "compute": [1.0], "memory": [2.0]}
        if kind == "finish":
            row = {**base_row(args[1], args[0]), "status": "ok"}
            times = [t for s in args[2] for t in s.samples_ms]
            return Measured(row, times, [], rounds=tuple(s.round for s in args[2]))
        return None

    def close(self):
        pass


def _order(sent) -> list[list]:
    """Per round, who was timed in it, in order (impls timed together: their names joined)."""
    rounds: dict[int, list] = {}
    for kind, *args in sent:
        if kind == "time":
            rounds.setdefault(args[2], []).append(args[1].name)
        elif kind == "together":
            rounds.setdefault(args[2], []).append("".join(i.name for i in args[1]))
        elif kind == "anchor":
            rounds.setdefault(args[1], []).append(ANCHOR)
    return [rounds[r] for r in sorted(rounds)]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_rounds_are_round_robin_the_order_rotated_each_round_the_anchor_among_them(device):
    """On a GPU each impl takes its part of a round in a step of its own; on a CPU the impls
    take theirs together, sample by sample (timing.interleaved), the anchor before or after."""
    impls = [_impl(n) for n in "abc"]
    script = _Script()
    case = replace(CASE, device=device)
    rows = list(Worker(WorkerSpec(settings=FAST), script).run_case(case, impls))
    everyone = ["a", "b", "c", ANCHOR] if device == "cuda" else ["abc", ANCHOR]
    n = len(everyone)
    assert _order(script.sent) == [everyone[r % n :] + everyone[: r % n] for r in range(ROUNDS)]
    assert [m.row["impl"] for m in rows] == ["a", "b", "c"]
    for m in rows:  # every round's sample, its round kept
        assert m.rounds == tuple(range(ROUNDS)) and len(m.anchor) == ROUNDS


def test_a_step_that_fails_in_the_rounds_costs_its_row_and_the_case_is_prepared_again():
    impls = [_impl(n) for n in "abc"]
    script = _Script({("time", "b", 2): WorkerFailed("crash", "worker process died")})
    rows = {
        m.row["impl"]: m for m in Worker(WorkerSpec(settings=FAST), script).run_case(CASE, impls)
    }
    assert rows["b"].row["status"] == "crash"
    assert rows["b"].row["reason"] == "worker process died (during timing round 3)"
    assert rows["b"].row["time_ms"] is None and rows["b"].times == []
    for name in "ac":
        assert rows[name].row["status"] == "ok" and rows[name].rounds == tuple(range(ROUNDS))
    # the shared step of round 3 failed (a fresh server), then each alone: b's failed again
    assert [m[0] for m in script.sent].count("prepare") == 3
    assert _order(script.sent)[2][0] == "abc"
    assert set(_order(script.sent)[2][1:]) == {"a", "b", "c", ANCHOR}
    assert all("b" not in who for who in _order(script.sent)[3:])


def test_a_case_that_cannot_be_prepared_again_fails_its_remaining_rows_once_named():
    class Broken(_Script):
        def call(self, msg, timeout_s):
            if msg[0] == "prepare" and self.fresh:
                raise WorkerFailed("crash", "no worker")
            return super().call(msg, timeout_s)

    impls = [_impl(n) for n in "abc"]
    script = Broken({("time", "a", 1): WorkerFailed("timeout", "no result")})
    rows = {
        m.row["impl"]: m.row
        for m in Worker(WorkerSpec(settings=FAST), script).run_case(CASE, impls)
    }
    assert rows["a"]["status"] == "timeout"
    for name in "bc":
        assert rows[name]["status"] == "crash" and rows[name]["reason"] == f"{PREPARING}: no worker"


@pytest.fixture(scope="module")
def faulty_case():
    """A real worker process: g_abort aborts and g_hang hangs inside the first timing round;
    naive and sdpa, timed in the same rounds, finish. The hang's timeout is generous: no
    healthy step of this tiny case comes near it."""
    spec = WorkerSpec(plugins=(str(PLUGINS / "round_faults.py"),), settings=FAST, timeout_s=5.0)
    worker = Worker(spec, Subprocess(spec))
    impls = [_impl(n) for n in ("naive", "g_abort", "sdpa", "g_hang")]
    try:
        return {m.row["impl"]: m for m in worker.run_case(CASE, impls, impls[2])}
    finally:
        worker.close()


def test_an_abort_inside_the_rounds_is_one_crash_row(faulty_case):
    row = faulty_case["g_abort"].row
    assert row["status"] == "crash" and row["time_ms"] is None
    assert "SIGABRT" in row["reason"] and "planted abort in the rounds" in row["reason"]
    assert row["reason"].endswith("(during timing round 1)")


def test_a_hang_inside_the_rounds_is_one_timeout_row(faulty_case):
    row = faulty_case["g_hang"].row
    assert row["status"] == "timeout" and row["time_ms"] is None
    assert row["reason"].startswith("no result after 5 s; the worker process was killed")


def test_the_other_impls_of_the_case_finish_every_round(faulty_case):
    for name in ("naive", "sdpa"):
        m = faulty_case[name]
        assert m.row["status"] == "ok" and m.row["agrees"]
        assert set(m.rounds) == set(range(ROUNDS)) and len(m.rounds) == len(m.times)
        assert m.row["rounds"] == ROUNDS
    assert faulty_case["naive"].row["speedup"] is not None


def _sweep(impls, run_dir: Path, done=frozenset()):
    spec = WorkerSpec(settings=FAST)
    worker = Worker(spec, InProcess(spec))
    cases = [CASE, Case(batch=1, heads=1, kv_heads=1, seq_q=48, seq_kv=48, head_dim=16)]
    return run_sweep(cases, impls, run_dir, [worker], run_id="r", seed=0, progress=False, done=done)


@pytest.fixture(scope="module")
def resumed(impls, tmp_path_factory):
    """A run stopped part way through its cases' rows (sdpa's and naive's written, tiled's
    not), then resumed: tiled's rows run, timed in rounds with sdpa again. Returns the run
    folder and, from before the resume, its anchor samples and env.json anchor entry."""
    run = RunDir(tmp_path_factory.mktemp("rounds"))
    run.env.write_text("{}")  # as the sweep command writes it before the first row
    _sweep([impls["sdpa"], impls["naive"]], run.path)
    before = pd.read_csv(run.anchor), json.loads(run.env.read_text())["anchor"]
    _sweep([impls[n] for n in ("sdpa", "naive", "tiled")], run.path, done_keys(run.path))
    return run, *before


def test_resume_keeps_the_finished_rows_and_runs_the_rest(resumed):
    run, anchor, _ = resumed
    df = read_results(run.path)
    assert len(df) == 6 and not df.duplicated(["impl", "seq_q"]).any()
    assert list(df["impl"][4:]) == ["tiled", "tiled"]  # the finished rows kept as they were
    assert (df["status"] == "ok").all() and (df["rounds"] == ROUNDS).all()


def test_each_sample_has_its_round(resumed):
    run, _, _ = resumed
    samples = pd.read_csv(run.samples)
    per_row = samples.groupby(["impl", "seq_q"])["round"]
    assert (per_row.nunique() == ROUNDS).all() and samples["round"].between(0, ROUNDS - 1).all()
    counts = per_row.size()
    df = read_results(run.path).set_index(["impl", "seq_q"])
    assert (counts == df["samples"].reindex(counts.index)).all() and len(counts) == len(df)


def test_speedups_are_paired_by_round_against_the_baseline(resumed):
    run, _, _ = resumed
    df = read_results(run.path)
    samples = pd.read_csv(run.samples)
    base = df["impl"] == "sdpa"
    assert df.loc[base, ["speedup", "speedup_lo", "speedup_hi"]].isna().all().all()
    naive = df[df["impl"] == "naive"]
    assert (naive["speedup_lo"] <= naive["speedup"]).all()
    assert (naive["speedup"] <= naive["speedup_hi"]).all()

    def medians(impl, seq):
        s = samples[(samples["impl"] == impl) & (samples["seq_q"] == seq)]
        return round_medians(s["time_ms"], s["round"])

    for _, row in naive.iterrows():
        expected = ratio(medians("sdpa", row["seq_q"]), medians("naive", row["seq_q"]))
        assert row["speedup"] == pytest.approx(expected.value)
    # the resumed rows pair with sdpa timed again in their rounds (its samples not kept)
    assert df.loc[df["impl"] == "tiled", "speedup"].notna().all()


def _speeds(anchor: pd.DataFrame, seq: int, env: dict) -> tuple[float, float]:
    """What a row of the case of length ``seq`` should say, from its anchor samples."""
    case = anchor[anchor["seq_q"] == seq]
    now = case.groupby(["resource", "round"])["time_ms"].median().groupby("resource").median()
    return env["compute_ms"]["float32"] / now["compute"], env["memory_ms"] / now["memory"]


def test_the_anchor_is_relative_to_the_runs_start_across_a_resume(resumed):
    run, first_anchor, first_env = resumed
    env = json.loads(run.env.read_text())["anchor"]
    assert env == first_env  # the resumed part kept the run's start and reference times
    anchor = pd.read_csv(run.anchor)
    assert set(anchor["resource"]) == {"compute", "memory"}
    assert (anchor["t_s"] >= 0).all() and anchor["round"].between(0, ROUNDS - 1).all()
    df = read_results(run.path).set_index(["impl", "seq_q"])
    for impl in ("sdpa", "naive"):  # the run's first case is the reference
        assert df.loc[(impl, 32), ["speed_compute", "speed_memory"]].tolist() == [1.0, 1.0]
        got = df.loc[(impl, 48), ["speed_compute", "speed_memory"]].tolist()
        assert got == pytest.approx(_speeds(first_anchor, 48, env))
    resumed_anchor = anchor.iloc[len(first_anchor) :]  # each resumed case timed its anchor again
    for seq in (32, 48):
        got = df.loc[("tiled", seq), ["speed_compute", "speed_memory"]].tolist()
        assert got == pytest.approx(_speeds(resumed_anchor, seq, env))


def test_the_test_api_measures_through_the_sweeps_worker(impls, monkeypatch):
    """run_row and run_rows time their rows in rounds interleaved with the speed anchor, as
    a sweep's worker does, and pair each row with the baseline's rounds."""
    from attnbench.run.executing.steps import Steps

    anchored, anchor = [], Steps._anchor
    monkeypatch.setattr(
        Steps, "_anchor", lambda self, case, r: anchored.append(r) or anchor(self, case, r)
    )
    row = run_row(impls["naive"], CASE)
    assert row["status"] == "ok" and row["rounds"] == ROUNDS
    assert anchored == list(range(ROUNDS))
    rows = run_rows([impls["naive"], impls["sdpa"]], CASE, baseline=impls["sdpa"])
    assert rows["naive"]["speedup"] > 0 and rows["sdpa"]["speedup"] is None


def test_the_test_api_gives_complete_rows_as_results_csv_has_them(impls):
    """testing.run_row completes its row as a sweep does: every column of results.csv, what
    ran it, the run, the seed and the machine's speed (its own case is the reference)."""
    import socket

    from attnbench.store.schema import COLUMNS
    from attnbench.testing import TEST_RUN_ID

    row = run_row(impls["naive"], CASE, seed=7)
    assert list(row) == list(COLUMNS)
    assert row["status"] == "ok" and row["host"] == socket.gethostname()
    assert row["device_name"] and row["run_id"] == TEST_RUN_ID and row["seed"] == 7
    assert row["speed_compute"] == pytest.approx(1.0, rel=0.5) and row["speed_memory"] > 0


def test_the_anchor_speeds_are_a_function_of_the_reference_and_the_rounds():
    """measure/anchor.py: the first case of a dtype sets the reference; a case twice as slow
    has speed 0.5; nothing is read or written."""
    from attnbench.measure import anchor

    def rounds(compute_ms, memory_ms):
        return tuple(
            {"round": r, "t_unix": 100.0 + r, "compute": [compute_ms] * 2, "memory": [memory_ms]}
            for r in range(3)
        )

    start = {"start_unix": 100.0, "compute_ms": {}, "memory_ms": None}
    ref = anchor.reference(start, "float32", rounds(2.0, 4.0))
    assert ref == {"start_unix": 100.0, "compute_ms": {"float32": 2.0}, "memory_ms": 4.0}
    assert start["compute_ms"] == {}  # the given reference is left as it was
    assert anchor.reference(ref, "float32", rounds(9.0, 9.0)) == ref  # the first case stays
    bf16 = anchor.reference(ref, "bfloat16", rounds(1.0, 9.0))
    assert bf16["compute_ms"] == {"float32": 2.0, "bfloat16": 1.0} and bf16["memory_ms"] == 4.0
    slow = anchor.speeds(ref, "float32", rounds(4.0, 2.0))
    assert slow == {"speed_compute": 0.5, "speed_memory": 2.0}
    assert anchor.speeds(ref, "float16", rounds(4.0, 2.0))["speed_compute"] is None
    samples = anchor.samples(rounds(2.0, 4.0), start_unix=100.0)
    assert len(samples) == 3 * 3 and {s["t_s"] for s in samples} == {0.0, 1.0, 2.0}


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_cuda_rounds_time_every_round_with_events(graph):
    import torch

    from attnbench.measure.timing import time_fn

    x = torch.randn(512, 512, device="cuda")
    cfg = TimerConfig(rep_ms=5.0, min_samples=5, max_samples=50, cuda_graph=graph)
    timing = time_fn(lambda: x @ x, "cuda", cfg)
    assert set(timing.rounds) == set(range(ROUNDS)) and len(timing.rounds) == len(timing.samples_ms)
    assert 5 <= len(timing.samples_ms) <= 50 and min(timing.samples_ms) > 0


@pytest.mark.gpu
def test_the_cuda_anchor_times_both_resources():
    from attnbench.measure.anchor import RESOURCES, SAMPLES, Anchor

    got = Anchor("cuda", "bfloat16").round()
    assert sorted(got) == sorted(RESOURCES)
    assert all(len(got[r]) == SAMPLES and min(got[r]) > 0 for r in RESOURCES)


@pytest.mark.gpu
def test_a_cuda_case_is_timed_in_rounds_with_paired_speedups(impls):
    case = Case(1, 2, 2, 256, 256, 64, dtype="float16", device="cuda")
    spec = WorkerSpec(settings=Settings(TimerConfig(rep_ms=5.0)), device="cuda")
    worker = Worker(spec, InProcess(spec))
    sdpa = impls["sdpa"]
    rows = {m.row["impl"]: m for m in worker.run_case(case, [impls["naive"], sdpa], sdpa)}
    for m in rows.values():
        assert m.row["status"] == "ok" and m.row["rounds"] == ROUNDS and len(m.anchor) == ROUNDS
    assert rows["naive"].row["speedup"] > 0 and rows["sdpa"].row["speedup"] is None


def _statuses(run_dir: Path, statuses: dict) -> None:
    """results.csv with each (impl, seq_q)'s status changed as ``statuses`` says."""
    df = pd.read_csv(RunDir(run_dir).results, dtype=str, keep_default_na=False)
    for (impl, seq_q), status in statuses.items():
        df.loc[(df["impl"] == impl) & (df["seq_q"] == str(seq_q)), "status"] = status
    df.to_csv(RunDir(run_dir).results, index=False)


@pytest.mark.parametrize("retry", [(), ("crash",)])
def test_resume_runs_lost_rows_again_and_crash_rows_when_asked(impls, tmp_path, retry):
    two = [impls["sdpa"], impls["naive"]]
    _sweep(two, tmp_path)
    _statuses(tmp_path, {("naive", 32): "lost", ("naive", 48): "crash"})
    done = done_keys(tmp_path, retry)
    assert len(done) == (2 if retry else 3)
    ran = _sweep(two, tmp_path, done)
    assert sorted((r["impl"], r["seq_q"]) for r in ran) == [("naive", 32)] + (
        [("naive", 48)] if retry else []
    )
    df = read_results(tmp_path)
    assert len(df) == 4 and not df.duplicated(["impl", "seq_q"]).any()  # every row once
    assert df[["node", "actor", "gpu_index", "gpu_uuid"]].isna().all().all()  # local, CPU
    assert sorted(df["status"]) == ([] if retry else ["crash"]) + ["ok"] * (4 if retry else 3)
    samples = pd.read_csv(RunDir(tmp_path).samples)  # the rows run again: their samples once
    assert not samples.duplicated(["impl", "seq_q", "sample"]).any()


class _Recorder:
    """An executor that records the impls it is asked to run; each row an error."""

    host, device_name, where = "h", "d", {}

    def __init__(self):
        self.asked: list[tuple[str, int]] = []

    def run_case(self, case, impls, baseline=None):
        self.asked += [(i.name, case.seq_q) for i in impls]
        return [failed_row(i, case, "error", "fake") for i in impls]


def test_resume_keeps_the_out_of_memory_pruning(impls, tmp_path):
    cases = [CASE, Case(batch=1, heads=1, kv_heads=1, seq_q=48, seq_kv=48, head_dim=16)]
    with row_writer(tmp_path) as out:  # naive ran out of memory at 32 before the stop
        out.write(failed_row(impls["naive"], CASE, "oom", "out of memory").row | {"run_id": "r"})
    two, executor = [impls["sdpa"], impls["naive"]], _Recorder()
    run_sweep(
        cases,
        two,
        tmp_path,
        [executor],
        run_id="r",
        seed=0,
        progress=False,
        done=done_keys(tmp_path),
    )
    assert ("naive", 48) not in executor.asked and ("sdpa", 48) in executor.asked
    df = read_results(tmp_path).set_index(["impl", "seq_q"])
    assert df.loc[("naive", 48), "status"] == "oom"
    assert "ran out of memory at the smaller seq_q=32" in df.loc[("naive", 48), "reason"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--retry", "crsh", "--resume"], "--retry 'crsh': unknown status 'crsh'; did you mean"),
        (["--retry", "crash"], "--retry: only with --resume"),
    ],
)
def test_a_bad_retry_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    from attnbench.cli import main

    argv = ["sweep", "--device", "cpu", "--preset", "smoke", "--results-dir", str(tmp_path / "r")]
    assert main([*argv, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "r").exists()


def test_a_case_whose_inputs_run_out_of_memory_is_oom_rows_in_one_line(monkeypatch):
    """Drawing the inputs ran out of memory (the CPU allocator's RuntimeError): each runnable
    row is oom with one line naming the case, not the server's crash with a traceback."""
    import attnbench.run.measuring.row as row_module

    def refuse(case, seed):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 6710886400000 bytes. Error code 12"
        )

    monkeypatch.setattr(row_module, "make_inputs", refuse)
    spec = WorkerSpec(settings=FAST)
    worker = Worker(spec, InProcess(spec))
    rows = [m.row for m in worker.run_case(CASE, [_impl("a"), _impl("b")])]
    assert [r["status"] for r in rows] == ["oom", "oom"]
    for r in rows:
        assert r["reason"].startswith(f"{PREPARING}: out of memory at B=1 Hq=1 seq_q=32 ")
        assert "you tried to allocate 6710886400000 bytes" in r["reason"]
        assert "\n" not in r["reason"] and r["time_ms"] is None


def test_an_executor_lost_during_the_speed_anchor_gives_the_next_row_its_cause():
    """The actor died while timing the anchor (its node lost): the next step must not be
    tried on a dead actor, and the row that says so keeps Ray's reason and when it came."""
    impls = [_impl(n) for n in "abc"]
    lost = WorkerFailed(LOST, "actor lost (the node running it died); stderr: (empty)")
    script = _Script({("anchor", None, None): lost})  # the first round's anchor
    rows = [m.row for m in Worker(WorkerSpec(settings=FAST), script).run_case(CASE, impls)]
    assert rows[0]["status"] == LOST
    assert rows[0]["reason"] == f"{lost.reason} (during the speed anchor of timing round 1)"
    assert [m[0] for m in script.sent].count("prepare") == 1  # nothing sent past the loss


def test_cpu_impls_take_their_turns_sample_by_sample_within_a_round():
    """timing.interleaved: the functions' samples alternate (a change of the machine's speed
    within the round lands on each alike), each gets its round's budget and sample count, and
    one that raises leaves the turns while the others go on."""
    from attnbench.measure.timing import SAMPLE_MS, RoundTimer, interleaved

    calls, call_s = [], 0.0005

    def recorder(name, fail_at=None):
        def fn():
            calls.append(name)
            time.sleep(call_s)
            if fail_at is not None and calls.count(name) >= fail_at:
                raise RuntimeError("planted")

        return fn

    cfg = TimerConfig(rep_ms=50.0, min_samples=10, rounds=5)
    # c raises on its third call, inside its samples (its first call sizes its block)
    timers = {n: RoundTimer(recorder(n, 3 if n == "c" else None), "cpu", cfg) for n in "abc"}
    failures = {}
    slices = interleaved(timers, 3, lambda key, exc: failures.setdefault(key, str(exc)))
    assert set(slices) == {"a", "b"} and failures == {"c": "planted"}
    budget_ms, low, _ = cfg.per_round()
    for part in slices.values():
        assert part.round == 3 and len(part.samples_ms) >= low
        per_sample = part.calls / len(part.samples_ms)
        assert sum(part.samples_ms) * per_sample >= budget_ms  # the round's budget, at least
    # in turns: a function's run of calls is one sample's block (at most SAMPLE_MS of calls),
    # or two where the rotated order puts it last in one turn and first in the next
    last = min(max(i for i, n in enumerate(calls) if n == x) for x in "ab")
    runs = [len(list(g)) for _, g in itertools.groupby(calls[: last + 1])]
    assert max(runs) <= 2 * SAMPLE_MS / (call_s * 1e3) + 1, runs
    assert len(runs) >= 2 * low
