"""The kernel lab's guards: its parallel phase (one process per job, each with a deadline) and
its timing pass's watchdog.

A job is a call of a picklable function in a fresh (spawned) process, which sends back one dict.
Several run at once; each is bounded by ``timeout_s`` from the moment its process is ready
(``prepare`` done: the imports every job shares, which a busy host can make slow; at most
``START_S`` for that): one with no answer by then is killed and its answer is
``{"hang": reason}``; one whose process dies
without an answer (a segfault, an abort, a CUDA error that ended it) is ``{"error": reason}``;
one not started before ``deadline`` (time.monotonic) is ``{"skipped": reason}``, and one still
running then is killed with the same answer. So a job that hangs or crashes costs its own
answer and a slot for at most ``timeout_s``, never the phase."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Hashable

START_S = 300.0  # a process not ready by then (its imports hung) is a hang too


def _entry(conn, prepare: Callable[[], None] | None, fn: Callable[..., dict], args: tuple) -> None:
    if prepare is not None:
        prepare()
    conn.send(None)  # ready: the job's own clock starts
    conn.send(fn(*args))
    conn.close()


def run_jobs(
    fn: Callable[..., dict],
    jobs: dict[Hashable, tuple],
    parallel: int,
    timeout_s: float,
    deadline: float,
    prepare: Callable[[], None] | None = None,
) -> dict[Hashable, dict]:
    """key -> fn(*args)'s dict (or the hang/error/skipped answer above), jobs started in the
    order given, at most ``parallel`` at once; ``prepare()`` runs in each process first."""
    ctx = mp.get_context("spawn")  # a fresh CUDA context per job; fork would copy the parent's
    pending, running, answers = list(jobs), {}, {}
    while pending or running:
        while pending and len(running) < max(1, parallel):
            key = pending.pop(0)
            if time.monotonic() >= deadline:
                answers[key] = {"skipped": "the lab's budget was spent before it started"}
                continue
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_entry, args=(send, prepare, fn, jobs[key]), daemon=True)
            proc.start()
            send.close()  # the child holds the only sending end: its death closes the pipe
            running[key] = (proc, recv, [time.monotonic(), None])  # started, ready
        for key, (proc, recv, clock) in list(running.items()):
            answer = _answer(proc, recv, clock, timeout_s, deadline)
            if answer is None:
                continue
            answers[key] = answer
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            recv.close()
            del running[key]
        time.sleep(0.02)
    return answers


def _answer(proc, recv, clock: list, timeout_s: float, deadline: float) -> dict | None:
    """The job's answer if it has one now (sent, died, timed out, past the deadline);
    ``clock``: [started, ready or None], ready set here when the process says so."""
    while recv.poll():
        try:
            message = recv.recv()
        except (EOFError, OSError):  # died (while sending, or before it could)
            proc.join(5)
            return {"error": f"its process died (exit code {proc.exitcode}) with no answer"}
        if message is not None:
            return message
        clock[1] = time.monotonic()
    if not proc.is_alive():
        proc.join(5)
        if recv.poll():  # sent just before it ended
            return _answer(proc, recv, clock, timeout_s, deadline)
        return {"error": f"its process died (exit code {proc.exitcode}) with no answer"}
    now = time.monotonic()
    if clock[1] is None and now - clock[0] > START_S:
        return {"hang": f"its process was not ready within {START_S:g} s (killed)"}
    if clock[1] is not None and now - clock[1] > timeout_s:
        return {"hang": f"no answer within {timeout_s:g} s (its process was killed)"}
    if now >= deadline:
        return {"skipped": "the lab's budget ran out while it ran (its process was killed)"}
    return None


class Watchdog:
    """The timing pass's deadline, in the lab's own process: ``with watching(row, rest)``
    around one row's work; if it has not returned within ``timeout_s``, ``on_hang(row, rest)``
    runs on the watchdog's thread (which writes the rows and ends the process: a kernel that
    hangs on the GPU cannot be interrupted from Python, and holds the device)."""

    def __init__(self, timeout_s: float, on_hang: Callable[[dict, list], None]):
        self.timeout_s, self.on_hang = timeout_s, on_hang

    @contextlib.contextmanager
    def watching(self, row: dict, rest: list):
        timer = threading.Timer(self.timeout_s, self.on_hang, (row, rest))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
