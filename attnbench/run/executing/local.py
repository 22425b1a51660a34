"""The local transports of a worker (run/executing/worker.py). ``InProcess`` answers its steps in
this process (no start-up cost; a crash of the impl is a crash of the sweep). ``Subprocess`` sends
them to a worker process over a pipe, so that a segfault, an abort, a poisoned CUDA context or
a hang costs one row (status crash / timeout) and a fresh worker process. A Ray actor
(run/executing/ray_executor.py) measures through a ``Subprocess`` of its own."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

from attnbench import plugins
from attnbench.measure import allocator
from attnbench.run.executing.environment import device_name
from attnbench.run.executing.steps import Steps, wire
from attnbench.run.executing.worker import WorkerFailed, WorkerSpec
from attnbench.run.measuring import heap

STDERR_TAIL_CHARS = 600  # a crash row's reason keeps this much of the dead process's stderr
CLOSE_WAIT_S = 10.0  # a worker's clean exit at the end of a sweep
READY = "ready"  # a worker process's first message: started, registry loaded


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


class InProcess:
    def __init__(self, spec: WorkerSpec):

        self.host, self.device_name = socket.gethostname(), device_name(spec.device)
        self.where: dict = {}  # this machine: no node or actor to name
        if spec.settings.malloc_tunables:
            allocator.pin_in_process()
        _set_threads(spec.threads)
        self.steps = Steps(plugins.discover(spec.plugins), spec.seed, spec.device)

    def call(self, msg: tuple, timeout_s: float | None):
        try:
            with _exits_caught():
                return self.steps.handle(msg)
        except _Exited as exc:
            self.steps.prepared = None  # as a fresh worker would be: the case is made again
            raise WorkerFailed(
                "crash",
                f"it called {exc.how}({exc.code!r}) in the sweep's own process "
                "(--no-isolate); the call was stopped there",
            ) from None

    def replace(self, say=print) -> bool:
        return False  # a step never loses this process

    def loss_detail(self) -> str:
        return ""  # nothing is lost here

    def close(self) -> None:
        self.steps.prepared = None


class _Exited(BaseException):
    """A step's ``sys.exit`` or ``os._exit`` in this process, stopped."""

    def __init__(self, how: str, code):
        super().__init__(how, code)
        self.how, self.code = how, code


@contextmanager
def _exits_caught():
    """--no-isolate: an impl that calls ``sys.exit`` or ``os._exit`` would end the sweep with
    its own exit code (``os._exit(0)``: success, with no rows, no report and nothing said);
    during a step either is stopped instead (``_Exited``), and the step is that row's crash,
    as in a worker process. ``os._exit`` in a process forked meanwhile still exits it."""
    real, pid = os._exit, os.getpid()

    def exit_here(code: int) -> None:
        if os.getpid() != pid:
            real(code)
        raise _Exited("os._exit", code)

    os._exit = exit_here
    try:
        yield
    except SystemExit as exc:
        raise _Exited("sys.exit", exc.code) from None
    finally:
        os._exit = real


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a sweep or Ray actor killed
    with -9 leaves no worker running on); elsewhere nothing. The "parent" is the thread that
    started it: a worker started from a short-lived thread dies with that thread."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(conn, spec: WorkerSpec, stderr_path: str) -> None:
    """The worker process's loop: a step in, its answer out, until the parent closes the
    pipe (then it returns, and the process exits cleanly)."""
    _die_with_parent()
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    _set_threads(spec.threads)

    steps = Steps(plugins.discover(spec.plugins), spec.seed, spec.device)
    heap.freeze_startup()  # a row's garbage collection then skips the start-up's objects
    conn.send(READY)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        conn.send(steps.handle(msg))


class Subprocess:
    """One worker process at a time, started at the first step and replaced after a crash or
    a timeout (the next step then finds it unprepared)."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.host, self.device_name = socket.gethostname(), device_name(spec.device)
        self.where: dict = {}  # this machine: no node or actor to name
        self.proc = self.conn = None
        self._dir = tempfile.TemporaryDirectory(prefix="attnbench-worker-")
        self.stderr_path = Path(self._dir.name) / "stderr.log"

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.stderr_path.write_text("")
        self.proc = ctx.Process(
            target=_serve, daemon=True, args=(child, self.spec, str(self.stderr_path))
        )
        with allocator.worker_environment(self.spec.settings.malloc_tunables):
            self.proc.start()  # the worker reads GLIBC_TUNABLES at its start
        child.close()
        self._receive()  # its start-up (torch, the registry) counts against no step's timeout

    def _receive(self):
        try:
            return self.conn.recv()
        except (EOFError, ConnectionError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.proc = None
            raise WorkerFailed(
                "crash", f"worker process died ({describe_exit(code)}); stderr: {self._tail()}"
            ) from None

    def call(self, msg: tuple, timeout_s: float | None):
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(wire(msg))
        if not self.conn.poll(timeout_s):
            self.stop()
            raise WorkerFailed(
                "timeout", f"no result after {timeout_s:g} s; the worker process was killed"
            )
        return self._receive()

    def _tail(self) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return "(unreadable)"
        return stderr_tail(" | ".join(line.strip() for line in text.splitlines() if line.strip()))

    def replace(self, say=print) -> bool:
        return False  # a crashed worker process is restarted by the next step, not replaced

    def loss_detail(self) -> str:
        return ""  # a worker process's loss is its row's crash, said in full

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


def stderr_tail(text: str) -> str:
    """A dead process's stderr, one line, cut to its last STDERR_TAIL_CHARS."""
    if len(text) > STDERR_TAIL_CHARS:
        return "..." + text[-STDERR_TAIL_CHARS:]
    return text or "(empty)"


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
