"""The sweep: cases x impls -> one durable row each. Read top-down.

Cases are run family by family (a family: one case at every sequence length), in increasing
length, so that an impl that runs out of memory at one length is not tried at larger ones of
the same family. Families go to the executors (one, or one per device), the costliest first
when there are several, and a family is never split: one executor runs it whole, so a scaling
series comes from one device. This process alone writes the rows, each flushed and fsynced as
soon as it exists, and stamps each with the ``host`` and ``device_name`` that ran it. It also
writes each case's drawn data to the draws file before the case's first row, and a failed
row's full error to the errors log when its reason had to be cut short (store/rundir.py)."""

from __future__ import annotations

import itertools
import json
import socket
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from attnbench import registry
from attnbench.case import Case
from attnbench.registry import Impl
from attnbench.run import heap
from attnbench.run.failed import Measured, base_row, failed
from attnbench.run.inputs import draws
from attnbench.run.row import release
from attnbench.run.worker import Worker
from attnbench.store.env import device_name
from attnbench.store.results import (
    AnchorLog,
    kernels_writer,
    row_key,
    row_writer,
    samples_writer,
)
from attnbench.store.rundir import RunDir, append_line

REASON_CHARS = 160  # --row-lines: a failed row's reason, shortened between words

Family = list[tuple[Case, list[Impl]]]  # (case, the impls still to run on it), by length


def run_sweep(
    cases: list[Case],
    impls: list[Impl],
    run_dir: Path,
    executors: list[Worker],
    *,
    run_id: str,
    seed: int,
    progress: bool = True,
    row_lines: bool = False,
    done: set[tuple] | dict[tuple, str | None] = frozenset(),
    group_by_device_name: bool = True,
) -> list[dict]:
    """Run every (case, impl) whose key is not in ``done`` and append its row to
    run_dir/results.csv. Returns the rows run here. An impl that fails, runs out of memory,
    crashes or hangs becomes a row, never an exception.

    ``done`` may map each key to the device_name that ran it (a resumed run): with
    ``group_by_device_name``, a family that was started on one kind of device is then handed
    only to executors of that kind (an executor's ``device_name``), if any
    is present, so that no scaling series mixes devices."""
    families = _families(cases, impls, done)
    if len(executors) > 1:  # the costliest first, so that the last family to finish is short
        families.sort(key=lambda f: -sum(c.flops() * len(ims) for c, ims in f))
    names = {ex.device_name for ex in executors}
    started = _started_on(cases, impls, done) if group_by_device_name else {}
    pins = [started.get(family_key(f[0][0])) for f in families]
    work = _Work(families, [p if p in names else None for p in pins])
    total = sum(len(ims) for f in families for _, ims in f)
    baseline = next((i for i in impls if i.name == registry.baseline(impls)), None)
    with (
        heap.frozen(),
        _Writer(run_dir, run_id, seed, total, progress, row_lines, len(executors)) as writer,
    ):
        stop = threading.Event()
        lanes = [
            threading.Thread(target=_lane, args=(ex, work, writer, stop, baseline), daemon=True)
            for ex in executors[1:]
        ]
        for lane in lanes:
            lane.start()
        try:
            _lane(executors[0], work, writer, stop, baseline)
            for lane in lanes:
                while lane.is_alive():
                    lane.join(0.2)  # a short wait keeps Ctrl-C deliverable
        finally:
            stop.set()
        if writer.error:
            raise writer.error
    return writer.rows


class _Work:
    """The families still to hand out, in order. A family pinned to a device name goes only
    to an executor of that name."""

    def __init__(self, families: list[Family], pins: list[str | None]):
        self._todo = list(zip(families, pins))
        self._lock = threading.Lock()

    def take(self, name: str | None) -> Family | None:
        with self._lock:
            for i, (_, pin) in enumerate(self._todo):
                if pin is None or pin == name:
                    return self._todo.pop(i)[0]
        return None


def _started_on(cases: list[Case], impls: list[Impl], done) -> dict[tuple, str]:
    """Family key -> the device_name of its first finished row, over every case of the grid
    (finished cases included), when ``done`` records device names."""
    started: dict[tuple, str] = {}
    if isinstance(done, dict):
        for case in cases:
            for impl in impls:
                name = done.get(row_key(base_row(impl, case)))
                if name:
                    started.setdefault(family_key(case), name)
    return started


def _lane(
    executor: Worker, work: _Work, writer: _Writer, stop: threading.Event, baseline: Impl | None
) -> None:
    """One executor's loop: take a family, run its cases in order, hand each row over."""
    while not stop.is_set():
        family = work.take(executor.device_name)
        if family is None:
            return
        oom_at: dict[str, Case] = {}  # impl -> the smallest case of this family it ran out at
        for case, case_impls in family:
            if stop.is_set():
                return
            writer.draws(case, case_impls)
            skipped = [m for i in case_impls if (m := _skip_after_oom(i, case, oom_at))]
            names = {m.row["impl"] for m in skipped}
            todo = [i for i in case_impls if i.name not in names]
            ran = executor.run_case(case, todo, baseline)
            for measured in itertools.chain(skipped, ran):
                if stop.is_set():
                    return
                row = measured.row  # what ran it: the executor's device, else this machine's
                row["host"] = row.get("host") or executor.host or socket.gethostname()
                row["device_name"] = (
                    row.get("device_name") or executor.device_name or device_name(case.device)
                )
                if row["status"] == "oom":
                    oom_at.setdefault(row["impl"], case)
                try:
                    writer.write(measured, f"{row['impl']}: {case.label()}")
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
        lanes: int = 1,
    ):
        self.run_dir, self.run_id, self.seed = run_dir, run_id, seed
        self.total, self.row_lines, self.lanes = total, row_lines, lanes
        self.rows: list[dict] = []
        self.per_device: Counter[tuple[str, str]] = Counter()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._bar = tqdm(total=total, disable=not progress, unit="row", dynamic_ncols=True)
        self._last_row = time.perf_counter()

    def __enter__(self) -> _Writer:
        self._out = row_writer(self.run_dir)
        self._samples = samples_writer(self.run_dir)
        self._kernels = kernels_writer(self.run_dir)
        self._anchor = AnchorLog(self.run_dir)
        self._drawn = set(RunDir(self.run_dir).read_draws())  # a resumed run's cases keep theirs
        return self

    def draws(self, case: Case, impls: list[Impl]) -> None:
        """The case's drawn data to the draws file, once per case (before its first row)."""
        if case.label() in self._drawn:
            return
        paged = any(i.paged and not i.reasons(case) for i in impls)
        record = draws(case, self.seed, paged=paged)
        with self._lock:
            if record is not None and case.label() not in self._drawn:
                append_line(RunDir(self.run_dir).draws, json.dumps(record) + "\n")
            self._drawn.add(case.label())

    def write(self, measured: Measured, label: str) -> None:
        row, times, kernels = measured.row, measured.times, measured.kernels
        row.update(run_id=self.run_id, seed=self.seed)
        with self._lock:
            if measured.error:  # before the row, which names the file
                append_line(
                    RunDir(self.run_dir).errors,
                    f"== {label} ({row['status']}) ==\n{measured.error.rstrip()}\n\n",
                )
            if row["status"] == "ok" and measured.anchor:
                row.update(self._anchor.speeds(row, measured.anchor))
            self._samples.write(
                [
                    {**row, "sample": i, "round": r, "time_ms": t}
                    for i, (t, r) in enumerate(zip(times, measured.rounds))
                ]
            )
            self._kernels.write([{**row, **k} for k in kernels])
            self._out.write(row)
            self.rows.append(row)
            self.per_device[(row["device_name"], row["host"])] += 1
            self._bar.set_postfix_str(self._postfix(label), refresh=False)
            self._bar.update()
            if self.row_lines:  # with the seconds since the last row (its whole cost)
                now = time.perf_counter()
                print(
                    f"[{len(self.rows)}/{self.total}] {label}: {_outcome(row)} "
                    f"({now - self._last_row:.1f} s)",
                    flush=True,
                )
                self._last_row = now

    def _postfix(self, label: str) -> str:
        """The last row; with several executors, also the rows per device and host."""
        if self.lanes < 2:
            return label
        counts = ", ".join(f"{_short(d)}@{h} {n}" for (d, h), n in sorted(self.per_device.items()))
        return f"{counts} | {label}"

    def __exit__(self, *exc) -> None:
        self._bar.close()
        for appender in (self._out, self._samples, self._kernels, self._anchor):
            appender.close()


def _short(name: str, chars: int = 20) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "…"


def _outcome(row: dict) -> str:
    if row["status"] != "ok":  # a long reason shortened between words (the CSV has it whole)
        reason = textwrap.shorten(row["reason"] or "", REASON_CHARS, placeholder=" ...")
        return f"{row['status']} ({reason})"
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
