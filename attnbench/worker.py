"""Isolation: a worker process that measures rows, so that a segfault, an abort, a poisoned CUDA
context or a hang costs one row (status crash / timeout) and a fresh worker, never the sweep."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
from pathlib import Path

from attnbench.case import Case

STDERR_TAIL_CHARS = 600


class WorkerFailed(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _serve(conn, plugins: list[str], seed: int, settings, stderr_path: str) -> None:
    """The worker's loop: ("prepare", case) then any number of ("measure", impl name)."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    from attnbench import registry
    from attnbench.sweep import Prepared

    impls = registry.discover(plugins)
    prepared = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "prepare":
            prepared = Prepared(msg[1], seed, settings)
            conn.send(("ok", None))
        elif msg[0] == "measure":
            conn.send(("ok", prepared.measure(impls[msg[1]])))


class Worker:
    """One worker process at a time; replaced after a crash or a timeout."""

    def __init__(self, plugins: list[str], seed: int, settings, timeout_s: float | None):
        self.plugins, self.seed, self.settings, self.timeout_s = plugins, seed, settings, timeout_s
        self.proc = self.conn = None
        self.case: Case | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="attnbench-worker-")
        self.stderr_path = Path(self._dir.name) / "stderr.log"

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.stderr_path.write_text("")
        self.proc = ctx.Process(target=_serve, daemon=True, args=(
            child, self.plugins, self.seed, self.settings, str(self.stderr_path)))
        self.proc.start()
        child.close()

    def _call(self, msg: tuple, timeout_s: float | None):
        if self.proc is None or not self.proc.is_alive():
            self._start()
            if msg[0] == "measure" and self.case is not None:
                self._call(("prepare", self.case), None)
        self.conn.send(msg)
        if not self.conn.poll(timeout_s):
            self.stop()
            raise WorkerFailed("timeout", f"no result after {timeout_s:g} s; the worker "
                                          f"process was killed")
        try:
            return self.conn.recv()[1]
        except (EOFError, ConnectionError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.proc = None
            raise WorkerFailed("crash", f"worker process died ({_describe(code)}); "
                                        f"stderr: {self._stderr_tail()}") from None

    def prepare(self, case: Case) -> None:
        self.case = case
        self._call(("prepare", case), None)

    def measure(self, impl_name: str):
        return self._call(("measure", impl_name), self.timeout_s)

    def _stderr_tail(self) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "(unreadable)"
        text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
        return ("..." + text[-STDERR_TAIL_CHARS:]) if len(text) > STDERR_TAIL_CHARS else (
            text or "(empty)")

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()


def _describe(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
