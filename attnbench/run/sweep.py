"""The sweep: cases x impls -> one durable row each. Read top-down.

Cases are run family by family (a family: one case at every sequence length), in increasing
length, so that an impl that runs out of memory at one length is not tried at larger ones of
the same family. Families go to the executors (one, or one per device); this process alone
writes the rows, each flushed and fsynced as soon as it exists."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from tqdm import tqdm

from attnbench.case import Case
from attnbench.registry import Impl
from attnbench.run.executors import Executor
from attnbench.run.row import Measured, base_row, failed, release
from attnbench.store.results import kernels_writer, row_key, row_writer, samples_writer

Family = list[tuple[Case, list[Impl]]]  # (case, the impls still to run on it), by length


def run_sweep(
    cases: list[Case],
    impls: list[Impl],
    run_dir: Path,
    executors: list[Executor],
    *,
    run_id: str,
    seed: int,
    progress: bool = True,
    row_lines: bool = False,
    done: set[tuple] = frozenset(),
) -> list[dict]:
    """Run every (case, impl) whose key is not in ``done`` and append its row to
    run_dir/results.csv. Returns the rows run here. An impl that fails, runs out of memory,
    crashes or hangs becomes a row, never an exception."""
    families = _families(cases, impls, done)
    if len(executors) > 1:  # the costliest first, so that the last family to finish is short
        families.sort(key=lambda f: -sum(c.flops() * len(ims) for c, ims in f))
    work: queue.SimpleQueue[Family] = queue.SimpleQueue()
    for family in families:
        work.put(family)
    total = sum(len(ims) for f in families for _, ims in f)
    with _Writer(run_dir, run_id, seed, total, progress, row_lines) as writer:
        stop = threading.Event()
        lanes = [
            threading.Thread(target=_lane, args=(ex, work, writer, stop), daemon=True)
            for ex in executors[1:]
        ]
        for lane in lanes:
            lane.start()
        try:
            _lane(executors[0], work, writer, stop)
            for lane in lanes:
                while lane.is_alive():
                    lane.join(0.2)  # a short wait keeps Ctrl-C deliverable
        finally:
            stop.set()
        if writer.error:
            raise writer.error
    return writer.rows


def _lane(
    executor: Executor, work: queue.SimpleQueue, writer: _Writer, stop: threading.Event
) -> None:
    """One executor's loop: take a family, run its cases in order, hand each row over."""
    while not stop.is_set():
        try:
            family = work.get_nowait()
        except queue.Empty:
            return
        oom_at: dict[str, Case] = {}  # impl -> the smallest case of this family it ran out at
        for case, case_impls in family:
            if stop.is_set():
                return
            executor.prepare(case, case_impls)
            for impl in case_impls:
                if stop.is_set():
                    return
                measured = _skip_after_oom(impl, case, oom_at) or executor.measure(impl)
                if measured.row["status"] == "oom":
                    oom_at.setdefault(impl.name, case)
                try:
                    writer.write(measured, f"{impl.name}: {case.label()}")
                except Exception as exc:  # noqa: BLE001 - a write failure stops every lane
                    writer.error = writer.error or exc
                    stop.set()
                    return
            release(case)


class _Writer:
    """The one writer: samples, then kernels, then the row (the row is the commit point)."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        seed: int,
        total: int,
        progress: bool,
        row_lines: bool = False,
    ):
        self.run_dir, self.run_id, self.seed = run_dir, run_id, seed
        self.total, self.row_lines = total, row_lines
        self.rows: list[dict] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._bar = tqdm(total=total, disable=not progress, unit="row", dynamic_ncols=True)

    def __enter__(self) -> _Writer:
        self._out = row_writer(self.run_dir)
        self._samples = samples_writer(self.run_dir)
        self._kernels = kernels_writer(self.run_dir)
        return self

    def write(self, measured: Measured, label: str) -> None:
        row, times, kernels = measured
        row.update(run_id=self.run_id, seed=self.seed)
        with self._lock:
            self._samples.write([{**row, "sample": i, "time_ms": t} for i, t in enumerate(times)])
            self._kernels.write([{**row, **k} for k in kernels])
            self._out.write(row)
            self.rows.append(row)
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update()
            if self.row_lines:
                print(f"[{len(self.rows)}/{self.total}] {label}: {_outcome(row)}", flush=True)

    def __exit__(self, *exc) -> None:
        self._bar.close()
        for appender in (self._out, self._samples, self._kernels):
            appender.close()


def _outcome(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']} ({(row['reason'] or '')[:120]})"
    agrees = {True: "agrees", False: "DISAGREES", None: "not checked"}[row["agrees"]]
    return f"ok {row['time_ms']:.4g} ms, {agrees}"


def _families(cases: list[Case], impls: list[Impl], done: set[tuple]) -> list[Family]:
    """The cases still to run, grouped by family in first-appearance order, each by length."""
    families: dict[tuple, Family] = {}
    for case in cases:
        todo = [i for i in impls if row_key(base_row(i, case)) not in done]
        if todo:
            families.setdefault(family_key(case), []).append((case, todo))
    return [sorted(f, key=lambda ci: (ci[0].seq_q, ci[0].seq_kv)) for f in families.values()]


def family_key(case: Case) -> tuple:
    """Everything but the sequence lengths."""
    return tuple(v for k, v in case.as_dict().items() if k not in ("seq_q", "seq_kv"))


def _skip_after_oom(impl: Impl, case: Case, oom_at: dict[str, Case]) -> Measured | None:
    small = oom_at.get(impl.name)
    if small is None or case.seq_q < small.seq_q or case.seq_kv < small.seq_kv:
        return None
    return failed(
        impl,
        case,
        "oom",
        f"skipped: {impl.name} ran out of memory at the smaller "
        f"seq_q={small.seq_q}, seq_kv={small.seq_kv} of this "
        f"case family",
    )
