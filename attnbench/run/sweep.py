"""The sweep: cases x impls -> one durable row each. Read top-down.

Cases are run family by family (a family: one case at every sequence length), in increasing
length, so that an impl that runs out of memory at one length is not tried at larger ones of
the same family (run/oom.py). Families go to the executors (one, or one per device) through
the work queue (run/queue.py), the costliest first when there are several, and a family stays
on one device name: one executor runs it whole, or, when that executor is lost (its row in
flight ``lost``), the survivors of its device name finish it, so a scaling series comes from
one kind of device. This process alone completes the rows (run/complete.py: what ran each,
the run, the machine's speed) and writes them (run/writer.py)."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from textwrap import shorten

from attnbench import registry
from attnbench.case import Case
from attnbench.registry import Impl
from attnbench.run.complete import Completer
from attnbench.run.executing.worker import Worker, who
from attnbench.run.measuring import heap
from attnbench.run.measuring.failed import base_row, failed_row
from attnbench.run.measuring.row import release
from attnbench.run.oom import Ooms
from attnbench.run.progress import Progress
from attnbench.run.queue import Family, Work
from attnbench.run.writer import Writer
from attnbench.store.results import row_key
from attnbench.store.schema import LOST


def run_sweep(
    cases: list[Case],
    impls: list[Impl],
    run_dir: Path,
    executors: list[Worker],
    *,
    run_id: str,
    seed: int,
    baseline: str | None = None,
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
        families.sort(key=lambda f: -sum(_unmasked_work(c) * len(ims) for c, ims in f))
    names = {ex.device_name for ex in executors}
    started = _started_on(cases, impls, done) if group_by_device_name else {}
    pins = [started.get(family_key(f[0][0])) for f in families]
    work = Work(families, [p if p in names else None for p in pins])
    ooms = Ooms(family_key)
    if done:
        ooms.seed(cases, impls, run_dir)
    total = sum(len(ims) for f in families for _, ims in f)
    baseline = baseline or registry.baseline(impls)  # speedups are relative to it
    baseline = next((i for i in impls if i.name == baseline), None)
    shown = Progress(total, progress, row_lines, len(executors))
    completer = Completer(run_dir, run_id, seed)
    with heap.frozen(), Writer(run_dir, shown) as writer:
        stop = threading.Event()
        lanes = [
            threading.Thread(
                target=_lane, args=(ex, work, writer, completer, stop, baseline, ooms), daemon=True
            )
            for ex in executors[1:]
        ]
        for lane in lanes:
            lane.start()
        try:
            _lane(executors[0], work, writer, completer, stop, baseline, ooms)
            for lane in lanes:
                while lane.is_alive():
                    lane.join(0.2)  # a short wait keeps Ctrl-C deliverable
        finally:
            stop.set()
        if writer.error:
            raise writer.error
        _write_left(work.left(), writer, completer)
    return writer.rows


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
    executor: Worker,
    work: Work,
    writer: Writer,
    completer: Completer,
    stop: threading.Event,
    baseline: Impl | None,
    ooms: Ooms,
) -> None:
    """One executor's loop: take a family, run it, take the next. An executor lost part way
    gives the rest of its family back to the queue, for the survivors of its device name,
    and is replaced (within REPLACE_TIMEOUT_S); one that cannot be replaced leaves the pool."""
    while not stop.is_set():
        family = work.take(executor.device_name, stop)
        if family is None:
            return
        rest = None
        try:
            rest = _run_family(executor, family, writer, completer, stop, baseline, ooms)
        finally:
            work.done(rest, executor.device_name)
        if rest is not None and not _replaced(executor, writer.note):
            return


def _run_family(
    executor: Worker,
    family: Family,
    writer: Writer,
    completer: Completer,
    stop: threading.Event,
    baseline: Impl | None,
    ooms: Ooms,
) -> Family | None:
    """The family's cases in order, each row handed over; what is left of the family
    (its cases and impls not run) when the executor was lost, else None."""
    for n, (case, case_impls) in enumerate(family):
        if stop.is_set():
            return None
        writer.draws(completer.draws(case, case_impls))
        skipped = [m for i in case_impls if (m := ooms.skip(i, case))]
        names = {m.row["impl"] for m in skipped}
        todo = [i for i in case_impls if i.name not in names]
        written: set[str] = set()
        for measured in itertools.chain(skipped, executor.run_case(case, todo, baseline)):
            if stop.is_set():
                return None
            row = measured.row
            if row["status"] == "oom":
                ooms.ran_out(row["impl"], case)
            if row["status"] == LOST:  # said at once; what the executor learns later, written
                _say_lost(executor, writer, row, case)
            try:
                detail = executor.loss_detail() if row["status"] == LOST else ""
                anchor = completer.complete(
                    measured, executor.host, executor.device_name, executor.where, detail
                )
                writer.write(measured, f"{row['impl']}: {case.label()}", anchor)
            except Exception as exc:  # noqa: BLE001 - a write failure stops every lane
                writer.error = writer.error or exc
                stop.set()
                return None
            written.add(row["impl"])
            if row["status"] == LOST:  # the executor is gone: the rest goes back
                release(case)
                left = [i for i in case_impls if i.name not in written]
                return [*([(case, left)] if left else []), *family[n + 1 :]]
        release(case)
    return None


def _say_lost(executor: Worker, writer: Writer, row: dict, case: Case) -> None:
    """The line on a lost executor, at once: who, during which row, why."""
    writer.note(
        f"lost: {who(executor)}, during {row['impl']}: {case.label()} "
        f"({shorten(row['reason'] or '', 200, placeholder=' ...')}); the rest of its "
        f"family goes back to the queue"
    )


def _replaced(executor: Worker, say) -> bool:
    """A lost executor's replacement started (an executor that cannot be replaced: no);
    ``say`` gets a line on what it waits for and how that ended."""
    return executor.replace(say)


def _write_left(families: list[Family], writer: Writer, completer: Completer) -> None:
    """The rows of families that every executor of their device name was lost before
    running: ``lost``, so that --resume runs them."""
    for family in families:
        for case, case_impls in family:
            for impl in case_impls:
                measured = failed_row(
                    impl, case, LOST, "not run: every executor that could run it was lost"
                )
                writer.write(measured, f"{impl.name}: {case.label()}", completer.complete(measured))


def _families(cases: list[Case], impls: list[Impl], done: set[tuple]) -> list[Family]:
    """The cases still to run, grouped by family in first-appearance order, each by length."""
    families: dict[tuple, Family] = {}
    for case in cases:
        todo = [i for i in impls if row_key(base_row(i, case)) not in done]
        if todo:
            families.setdefault(family_key(case), []).append((case, todo))
    return [sorted(f, key=lambda ci: (ci[0].seq_q, ci[0].seq_kv)) for f in families.values()]


def _unmasked_work(case: Case) -> int:
    """A case's cost for ordering the work: its score matrix times D, as if nothing were
    masked (a mask's exact count needs its drawn layout)."""
    return case.batch * case.heads * case.seq_q * case.seq_kv * case.head_dim


def family_key(case: Case) -> tuple:
    """Everything but the sequence lengths."""
    return tuple(v for k, v in case.as_dict().items() if k not in ("seq_q", "seq_kv"))
