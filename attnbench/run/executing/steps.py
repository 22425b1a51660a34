"""The server side of a worker (run/executing/worker.py): where rows are measured (this
process, a worker process, a Ray actor's worker process), the steps it answers, one message
each:

    ("prepare", case, settings)      inputs and the float64 reference of ``case``: None, or
                                     ``PrepareFailed`` (status and reason of its rows)
    ("check", case, impl)            its checked call: None when it passed, else its row
    ("time", case, impl, round)      its part of a timing round (``timing.Slice``), or its row
    ("together", case, impls, round) CPU: their parts of a round taken in turns, sample by
                                     sample: impl name -> its Slice, or its row
    ("anchor", case, round)          the speed anchor's part of a round (measure/anchor.py)
    ("finish", case, impl, slices, base)  its row (``row.Measured``) from its slices; ``base``:
                                     the baseline's median per round (its speedup), or None
    ("device", packages)             the device's env.json entry (run/environment.device_env)
    ("ceilings", dtypes, quick)      the device's measured ceilings (measure/ceilings.py)

A step of a case it has not prepared (a fresh server after a crash) is answered UNPREPARED;
an impl it has not checked yet (the same) is checked first, within the step. Impls travel by
name (``wire``), except in this process, where they are the objects."""

from __future__ import annotations

import time

from attnbench.case import Case
from attnbench.measure.anchor import Anchor
from attnbench.registry import Impl
from attnbench.run.executing.worker import UNPREPARED, PrepareFailed
from attnbench.run.measuring import row
from attnbench.run.measuring.failed import Measured, case_failure
from attnbench.run.measuring.row import Checked, Prepared, Settings


class Steps:
    def __init__(self, impls: dict[str, Impl], seed: int, device: str):
        self.impls, self.seed, self.device = impls, seed, device
        self.prepared: Prepared | None = None
        self.checked: dict[str, Checked] = {}
        self.anchor: Anchor | None = None

    def handle(self, msg: tuple):
        kind, *args = msg
        if kind in ("check", "time", "together", "anchor", "finish") and not self._ready(args[0]):
            return UNPREPARED
        return getattr(self, f"_{kind}")(*args)

    def _ready(self, case: Case) -> bool:
        return self.prepared is not None and self.prepared.case == case

    def _prepare(self, case: Case, settings: Settings) -> PrepareFailed | None:
        """None, or why the case's inputs or reference could not be made (out of memory
        drawing them is its rows' oom, not the server's crash)."""
        self.prepared, self.checked = None, {}  # the last case's tensors go first
        prepared = Prepared(case, self.seed, settings)
        try:
            prepared.build()
        except Exception as exc:  # noqa: BLE001 - every failure is the case's rows' reason
            prepared = None
            return PrepareFailed(*case_failure(case, exc))
        self.prepared = prepared
        return None

    def _check(self, case: Case, impl: Impl | str) -> Measured | None:
        impl = impl if isinstance(impl, Impl) else self.impls[impl]
        p = self.prepared
        answer = row.check(impl, case, p.inputs, p.truth, p.settings)
        if isinstance(answer, Measured):
            return answer
        self.checked[impl.name] = answer
        return None

    def _checked(self, case: Case, impl: Impl | str) -> Checked | Measured:
        name = impl if isinstance(impl, str) else impl.name
        if name not in self.checked:  # a fresh server: checked again
            failed = self._check(case, impl)
            if failed is not None:
                return failed
        return self.checked[name]

    def _time(self, case: Case, impl: Impl | str, index: int):
        checked = self._checked(case, impl)
        return checked if isinstance(checked, Measured) else row.time_round(checked, index)

    def _together(self, case: Case, impls: tuple, index: int) -> dict:
        answers, group = {}, []
        for impl in impls:
            checked = self._checked(case, impl)
            if isinstance(checked, Measured):
                answers[checked.row["impl"]] = checked
            else:
                group.append(checked)
        return {**answers, **row.time_together(group, index)}

    def _finish(self, case: Case, impl: Impl | str, slices: list, base: dict | None) -> Measured:
        checked = self._checked(case, impl)
        if isinstance(checked, Measured):
            return checked
        del self.checked[checked.impl.name]
        try:
            return row.finish(checked, slices, self.prepared.settings, base)
        finally:
            checked = None
            row.release(case)

    def _anchor(self, case: Case, index: int) -> dict:
        if self.anchor is None or self.anchor.dtype != case.dtype:
            self.anchor = Anchor(self.device, case.dtype)
        return {"t_unix": time.time(), **self.anchor.round()}

    def _device(self, packages: tuple[str, ...]) -> dict:
        from attnbench.run.executing.environment import device_env

        return device_env(self.device, packages)

    def _ceilings(self, dtypes: list[str], quick: bool) -> dict:
        from attnbench.measure import ceilings

        return ceilings.measure(dtypes, self.device, quick=quick)


def wire(msg: tuple) -> tuple:
    """``msg`` for another process: each impl by its name (the server loads the registry),
    a tuple of impls too."""
    return tuple(_named(a) for a in msg)


def _named(a):
    if isinstance(a, Impl):
        return a.name
    if isinstance(a, tuple) and a and isinstance(a[0], Impl):
        return tuple(i.name for i in a)
    return a
