"""The sweep's work queue: the families still to run, handed to the lanes in order. A family
pinned to a device name goes only to an executor of that name. A lane whose executor is lost
gives the rest of its family back (``done(rest, pin)``), pinned to its device name, so that a
surviving executor of the same kind finishes it; a lane with nothing to take waits while
another lane's family may still come back."""

from __future__ import annotations

import threading

from attnbench.case import Case
from attnbench.registry import Impl

Family = list[tuple[Case, list[Impl]]]  # (case, the impls still to run on it), by length
WAIT_S = 0.2  # a waiting lane looks again this often (and a Ctrl-C gets through)


class Work:
    def __init__(self, families: list[Family], pins: list[str | None]):
        self._todo = list(zip(families, pins))
        self._busy = 0  # families handed out and not yet done
        self._cond = threading.Condition()

    def take(self, name: str | None, stop: threading.Event) -> Family | None:
        """The next family for an executor of ``name``, or None once none is left for it
        (or ``stop`` is set)."""
        with self._cond:
            while not stop.is_set():
                for i, (_, pin) in enumerate(self._todo):
                    if pin is None or pin == name:
                        self._busy += 1
                        return self._todo.pop(i)[0]
                if not self._busy:
                    return None
                self._cond.wait(WAIT_S)
        return None

    def done(self, rest: Family | None = None, pin: str | None = None) -> None:
        """A family taken is over; ``rest``, its cases and impls not run, goes back first."""
        with self._cond:
            self._busy -= 1
            if rest:
                self._todo.insert(0, (rest, pin))
            self._cond.notify_all()

    def left(self) -> list[Family]:
        """The families no executor took: every executor of their device name was lost."""
        with self._cond:
            return [family for family, _ in self._todo]
