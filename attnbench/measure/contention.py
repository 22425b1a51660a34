"""Did the process wait for a CPU while it was being timed? (CPU rows only.)

Another process on the same cores takes turns with the timed one: wall time goes on while
the timed threads wait in the kernel's run queue. Per-sample spreads do not show it (at a
steady load every sample is slowed alike), so the timed loop is read twice, before and after:

- ``cpu_share``: the process's CPU time over the loop / (wall time x torch threads). An idle
  machine gives between 1 / threads (a call that runs on one thread) and 1 (every thread busy
  all the time); a process that waited for a CPU gives less.
- ``wait_share``: the time its threads spent runnable but not running (Linux:
  /proc/self/task/*/schedstat, the run-queue delay) / (wall time x torch threads); None where
  the kernel does not report it. Near 0 on an idle machine, whatever the call's parallelism.

A timed loop is *contended* when its threads waited for a CPU more than CONTENDED_WAIT of
their time; where the wait is not reported, when the process ran less than CONTENDED_CORES
of one core (a CPU attention call keeps at least one thread busy, so less means it waited
or slept). On CUDA neither is measured: the host mostly waits on the device, and its CPU
time says nothing about the device's time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CONTENDED_WAIT = 0.10  # threads waiting for a CPU more than this share of the loop's time
CONTENDED_CORES = 0.8  # fallback without run-queue data: the process ran less than 0.8 cores
_TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class Usage:
    """A reading of this process's clocks."""

    wall_s: float
    cpu_s: float
    waits_s: dict[str, float] | None  # per thread id: run-queue delay so far; None: unknown


@dataclass(frozen=True)
class Contention:
    """What a timed loop got of the CPU (see the module's doc)."""

    cpu_share: float
    wait_share: float | None
    threads: int

    @property
    def contended(self) -> bool:
        if self.wait_share is not None:
            return self.wait_share > CONTENDED_WAIT
        return self.cpu_share * self.threads < CONTENDED_CORES

    def note(self) -> str:
        """The reason-column note of a contended loop."""
        waited = (
            f"its threads waited for a CPU {100 * self.wait_share:.0f}% of the time"
            if self.wait_share is not None
            else f"it ran {self.cpu_share * self.threads:.2f} cores on average"
        )
        return (
            f"contended: over the timed loop the process got {100 * self.cpu_share:.0f}% of "
            f"its {self.threads} thread(s)' time and {waited} (another process was using "
            f"the CPU), so time_ms is inflated and may move between identical runs"
        )


def usage() -> Usage:
    return Usage(time.perf_counter(), time.process_time(), _waits())


def between(before: Usage, after: Usage, threads: int) -> Contention | None:
    """The contention of the loop between two readings; None for an empty interval."""
    wall = after.wall_s - before.wall_s
    if wall <= 0 or threads < 1:
        return None
    cpu_share = (after.cpu_s - before.cpu_s) / (wall * threads)
    wait_share = None
    if before.waits_s is not None and after.waits_s is not None:
        waited = sum(w - before.waits_s.get(tid, 0.0) for tid, w in after.waits_s.items())
        wait_share = max(waited, 0.0) / (wall * threads)
    return Contention(cpu_share, wait_share, threads)


def _waits() -> dict[str, float] | None:
    """Run-queue delay of each thread of this process so far, in seconds (Linux schedstat:
    'time on CPU, time waiting to run, timeslices', in ns); None where it is not reported."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            fields = (_TASKS / tid / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that just ended
        if len(fields) >= 2:
            out[tid] = int(fields[1]) / 1e9
    return out or None
