"""The local executors, behind the protocol of ``executors.py``. ``InProcess`` measures in
this process (no start-up cost; a crash of the impl is a crash of the sweep). ``Subprocess``
measures in a worker process, so that a segfault, an abort, a poisoned CUDA context or a hang
costs one row (status crash / timeout) and a fresh worker. The Ray executor
(``attnbench.run.ray_executor``) puts the same protocol on one Ray actor per device, each
measuring through a ``Subprocess`` of its own."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import tempfile
from pathlib import Path

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.measure import allocator
from attnbench.registry import Impl
from attnbench.run import heap
from attnbench.run.row import Measured, Prepared, Settings, failed
from attnbench.store.env import device_name

STDERR_TAIL_CHARS = 600
CLOSE_WAIT_S = 10.0  # a worker's clean exit at the end of a sweep


class InProcess:
    def __init__(self, seed: int, settings: Settings, device: str = "cpu"):
        self.seed, self.settings = seed, settings
        self.host, self.device_name = socket.gethostname(), device_name(device)
        self.prepared: Prepared | None = None
        if settings.malloc_tunables:
            allocator.pin_in_process()

    def prepare(self, case: Case, impls: list[Impl]) -> None:
        self.prepared = Prepared(case, self.seed, self.settings)
        if any(not i.reasons(case) for i in impls):
            self.prepared.build()

    def measure(self, impl: Impl) -> Measured:
        return self.prepared.measure(impl)

    def close(self) -> None:
        self.prepared = None


class WorkerFailed(AttnbenchError):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a sweep or Ray actor killed
    with -9 leaves no worker running on); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(
    conn, plugins: list[str], seed: int, settings, stderr_path: str, threads: int | None = None
) -> None:
    """The worker's loop: ("prepare", case, build) then any number of ("measure", impl name),
    until the parent closes the pipe (then it returns, and the process exits cleanly)."""
    _die_with_parent()
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    if threads:
        import torch

        torch.set_num_threads(threads)
    from attnbench import registry

    impls = registry.discover(plugins)
    heap.freeze_startup()  # a row's garbage collection then skips the start-up's objects
    prepared = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "prepare":
            prepared = Prepared(msg[1], seed, settings)
            if msg[2]:
                prepared.build()
            conn.send(("ok", None))
        elif msg[0] == "measure":
            conn.send(("ok", prepared.measure(impls[msg[1]])))


class Subprocess:
    """One worker process at a time, started once and replaced after a crash or a timeout."""

    def __init__(
        self,
        plugins: list[str],
        seed: int,
        settings: Settings,
        timeout_s: float | None,
        threads: int | None = None,
        device: str = "cpu",
    ):
        self.plugins, self.seed, self.settings, self.timeout_s = plugins, seed, settings, timeout_s
        self.host, self.device_name = socket.gethostname(), device_name(device)
        self.threads = threads  # torch's CPU threads in the worker (None: torch's choice)
        self.proc = self.conn = None
        self.case: Case | None = None
        self.build = False
        self.broken: WorkerFailed | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="attnbench-worker-")
        self.stderr_path = Path(self._dir.name) / "stderr.log"

    def prepare(self, case: Case, impls: list[Impl]) -> None:
        self.start_case(case, any(not i.reasons(case) for i in impls))

    def start_case(self, case: Case, build: bool) -> None:
        """prepare() when the caller knows whether any impl will run (``build``)."""
        self.case, self.broken, self.build = case, None, build
        try:
            self._call(("prepare", case, self.build), None)
        except WorkerFailed as exc:
            self.broken = exc

    def measure(self, impl: Impl) -> Measured:
        if self.broken:
            return failed(
                impl,
                self.case,
                self.broken.status,
                f"while preparing the case: {self.broken.reason}",
            )
        try:
            return self._call(("measure", impl.name), self.timeout_s)
        except WorkerFailed as exc:
            return failed(impl, self.case, exc.status, exc.reason)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.stderr_path.write_text("")
        self.proc = ctx.Process(
            target=_serve,
            daemon=True,
            args=(
                child,
                self.plugins,
                self.seed,
                self.settings,
                str(self.stderr_path),
                self.threads,
            ),
        )
        with allocator.worker_environment(self.settings.malloc_tunables):
            self.proc.start()  # the worker reads GLIBC_TUNABLES at its start
        child.close()

    def _call(self, msg: tuple, timeout_s: float | None):
        if self.proc is None or not self.proc.is_alive():
            self._start()
            if msg[0] == "measure" and self.case is not None:  # a fresh worker: prepare again
                self._call(("prepare", self.case, self.build), None)
        self.conn.send(msg)
        if not self.conn.poll(timeout_s):
            self.stop()
            raise WorkerFailed(
                "timeout", f"no result after {timeout_s:g} s; the worker process was killed"
            )
        try:
            return self.conn.recv()[1]
        except (EOFError, ConnectionError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.proc = None
            raise WorkerFailed(
                "crash",
                f"worker process died ({describe_exit(code)}); stderr: {self._stderr_tail()}",
            ) from None

    def _stderr_tail(self) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "(unreadable)"
        text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
        return (
            ("..." + text[-STDERR_TAIL_CHARS:])
            if len(text) > STDERR_TAIL_CHARS
            else (text or "(empty)")
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc = None

    def close(self) -> None:
        """The worker exits on its own when its pipe closes, releasing what it holds (the
        semaphores of torch.compile's worker pools, which a killed process leaks); it is
        killed only if it has not exited within CLOSE_WAIT_S."""
        if self.proc is not None and self.proc.is_alive():
            self.conn.close()
            self.proc.join(CLOSE_WAIT_S)
        self.stop()
        self._dir.cleanup()


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
