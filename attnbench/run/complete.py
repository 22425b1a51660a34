"""A row completed in one place: what ran it (``host``, ``device_name``, and where: the node and
the GPU), the run it belongs to (``run_id``, ``seed``), and the machine's speed during its case
(``speed_compute``, ``speed_memory``: the case's speed-anchor rounds against the run's
reference, measure/anchor.py). The sweep completes every row here before the writer writes it,
and testing.run_rows its rows too. Also a case's drawn data for the run's draws file, once.

The reference is the anchor's median times at the run's first timed case (compute per dtype),
kept in env.json's ``anchor`` so that a resumed run stays relative to its start."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from attnbench.case import Case
from attnbench.measure import anchor
from attnbench.registry import Impl
from attnbench.run.executing.environment import device_name
from attnbench.run.measuring.failed import Measured
from attnbench.run.measuring.inputs import draws
from attnbench.store.env import read_anchor, write_anchor
from attnbench.store.results import row_key
from attnbench.store.rundir import RunDir


class Completer:
    """Completes the rows of one run, from every lane (thread-safe); without a ``run_dir``
    (testing.run_rows) its speed reference is kept in memory only."""

    def __init__(self, run_dir: Path | None, run_id: str, seed: int):
        self.env_path = RunDir(run_dir).env if run_dir is not None else None
        self.run_id, self.seed = run_id, seed
        self.reference = {"start_unix": time.time(), "compute_ms": {}, "memory_ms": None}
        if self.env_path is not None:
            self.reference.update(read_anchor(self.env_path))
        self._speeds: dict[tuple, dict] = {}  # case key -> its speeds
        self._drawn = set(RunDir(run_dir).read_draws()) if run_dir is not None else set()
        self._lock = threading.Lock()

    def draws(self, case: Case, impls: list[Impl]) -> dict | None:
        """The case's drawn data for the draws file (inputs.draws, with the block table when a
        paged impl runs it), the first time the case is seen; None after that, for a resumed
        run's cases (they keep theirs) and when the case draws nothing."""
        with self._lock:
            if case.label() in self._drawn:
                return None
            self._drawn.add(case.label())
        return draws(case, self.seed, paged=any(i.paged and not i.reasons(case) for i in impls))

    def complete(
        self,
        measured: Measured,
        host=None,
        device=None,
        where: dict | None = None,
        loss_detail: str = "",
    ) -> list[dict]:
        """Fill ``measured``'s row: the ``host`` and ``device`` (its name) that ran it, else this
        machine's; ``where`` (node, GPU) where the row has none; the run; a lost row's
        ``loss_detail`` (what its executor learned after the loss was said, e.g. the stderr); and
        an ok row's speeds. Returns its case's anchor samples for anchor.csv, the first time the
        case is seen."""
        row = measured.row
        if loss_detail:
            row["reason"] = (row["reason"] or "") + loss_detail
        row["host"] = row.get("host") or host or socket.gethostname()
        row["device_name"] = row.get("device_name") or device or device_name(row["device"])
        for column, value in (where or {}).items():
            row[column] = value if row.get(column) is None else row[column]
        row.update(run_id=self.run_id, seed=self.seed)
        if row["status"] != "ok" or not measured.anchor:
            return []
        key = row_key(row)[1:]  # the case (the impl left out)
        with self._lock:
            first = key not in self._speeds
            if first:
                self._speeds[key] = self._measure(row["dtype"], measured.anchor)
            row.update(self._speeds[key])
        if not first:
            return []
        return [{**row, **s} for s in anchor.samples(measured.anchor, self.reference["start_unix"])]

    def _measure(self, dtype: str, rounds: tuple[dict, ...]) -> dict:
        """The case's speeds; a reference that this case completes goes to env.json."""
        reference = anchor.reference(self.reference, dtype, rounds)
        if reference != self.reference:
            self.reference = reference
            if self.env_path is not None:
                write_anchor(self.env_path, reference)
        return anchor.speeds(reference, dtype, rounds)
