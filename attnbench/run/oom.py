"""Out-of-memory pruning: an impl that ran out of memory at one case of a family is not tried
at the family's larger ones; those rows are ``oom`` with a reason saying so. ``Ooms`` holds the
smallest such case per family and impl, seeded on ``--resume`` from the rows already written."""

from __future__ import annotations

import csv
from pathlib import Path

from attnbench.case import Case
from attnbench.registry import Impl
from attnbench.run.measuring.failed import Measured, base_row, failed_row
from attnbench.store.results import row_key
from attnbench.store.rundir import RunDir


class Ooms:
    def __init__(self, family_key):
        self._family_key = family_key
        self._at: dict[tuple, dict[str, tuple[int, int]]] = {}  # family -> impl -> (seq_q, seq_kv)

    def seed(self, cases: list[Case], impls: list[Impl], run_dir: Path) -> None:
        """The oom rows already in run_dir/results.csv (a resumed run)."""
        path = RunDir(run_dir).results
        if not path.exists():
            return
        with open(path, newline="", encoding="utf-8") as f:
            keys = {row_key(r) for r in csv.DictReader(f) if r.get("status") == "oom"}
        for case in cases:
            for impl in impls:
                if row_key(base_row(impl, case)) in keys:
                    self.ran_out(impl.name, case)

    def ran_out(self, impl: str, case: Case) -> None:
        at = self._at.setdefault(self._family_key(case), {})
        small = at.get(impl)
        if small is None or (case.seq_q, case.seq_kv) < small:
            at[impl] = (case.seq_q, case.seq_kv)

    def skip(self, impl: Impl, case: Case) -> Measured | None:
        """The impl's oom row if it ran out at a smaller case of this family, else None."""
        small = self._at.get(self._family_key(case), {}).get(impl.name)
        if small is None or case.seq_q < small[0] or case.seq_kv < small[1]:
            return None
        return failed_row(
            impl,
            case,
            "oom",
            f"skipped: {impl.name} ran out of memory at the smaller "
            f"seq_q={small[0]}, seq_kv={small[1]} of this case family",
        )
