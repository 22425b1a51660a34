"""The Ray transport of a worker (run/executing/worker.py): one Ray actor per device (a GPU, or
``--threads`` CPUs), across the machines of a Ray cluster (run/executing/ray_cluster.py joins it).

``RayActor`` is the transport in the sweep's process, one per device; it owns one ``_Actor`` at
a time, which answers each step through a worker process of its own (the local
``Subprocess``), so an impl that crashes or hangs costs its row as on one machine (status
crash with the signal, or timeout) and a fresh worker process. Impls travel by name: the
worker process loads the registry. An actor that dies itself (its node lost, killed from
outside) costs the step in flight (status lost); the sweep gives the rest of its family to
another actor and asks this one for a replacement (``replace``, bounded by
REPLACE_TIMEOUT_S). Nothing is retried by Ray, so no row runs twice. run/ray_start.py starts
the actors of a cluster, all at once."""

from __future__ import annotations

import os
import re
import socket
import tempfile

from attnbench.run.executing.local import CLOSE_WAIT_S, Subprocess, stderr_tail
from attnbench.run.executing.steps import wire
from attnbench.run.executing.worker import WorkerFailed, WorkerSpec
from attnbench.run.measuring.row import one_line
from attnbench.store.schema import LOST

START_TIMEOUT_S = 300.0  # the actors' first start-up: import torch (and a CUDA context)
REPLACE_TIMEOUT_S = 60.0  # a lost actor's replacement; none placed by then: its lane ends
READ_TIMEOUT_S = 10.0  # fetching a dead actor's stderr from its node
ERR_FILE = "attnbench-ray-actor-{pid}.err"  # an actor's stderr, in its node's temp folder
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a dead actor's stderr without Ray's own log lines, address dumps and faulthandler's module list
_NOISE = re.compile(
    r"logging\.cc:\d+:|^(PC: )?@ +0x|^Extension modules:|^Stack \(most recent|"
    r"^File \".*/site-packages/ray/|^:(job_id|actor_name|task_name):"
)


class _Actor:
    """Runs inside a Ray worker process and owns one device. It answers steps through a
    worker process of its own (the local ``Subprocess``), so an impl that crashes or hangs
    costs its row, named as on one machine (the signal, the worker's stderr), and the actor
    lives on. Its own stderr goes to a file, emptied before each step, so that a crash row
    can say how the actor died, if it does (its node lost, killed from outside)."""

    def __init__(self, spec: WorkerSpec):
        _remove_stale(tempfile.gettempdir())
        self.err_path = os.path.join(tempfile.gettempdir(), ERR_FILE.format(pid=os.getpid()))
        fd = os.open(self.err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        self.worker = Subprocess(spec)

    def info(self) -> dict:
        import ray

        return {
            "host": self.worker.host,
            "device_name": self.worker.device_name,
            "node_id": ray.get_runtime_context().get_node_id(),
            "err_path": self.err_path,
        }

    def call(self, msg: tuple, timeout_s: float | None) -> tuple:
        os.ftruncate(2, 0)  # the file holds this step's output only
        try:
            return ("ok", self.worker.call(msg, timeout_s))
        except WorkerFailed as exc:
            return ("failed", exc.status, exc.reason)

    def close(self) -> None:
        self.worker.close()


class RayActor:
    """The transport to one device's actor; a lost actor is replaced by ``replace``."""

    def __init__(self, ray, options: dict, spec: WorkerSpec, number: int = 0):
        self.ray, self.options, self.spec = ray, options, spec
        self.where: dict = {"actor": number}  # its replacements keep the number
        self.actor = None
        self.info: dict = {}
        self.host: str | None = None
        self.device_name: str | None = None
        self.lost: str | None = None  # why the last actor was lost (Ray's reason)
        self._detail_due = False  # its stderr not fetched yet (loss_detail)

    def launch(self) -> None:
        cls = self.ray.remote(_Actor).options(
            max_restarts=0, max_task_retries=0, **self.options
        )  # a lost actor is replaced here (replace), after its lost row, never by Ray
        self.actor = cls.remote(self.spec)
        self._info_ref = self.actor.info.remote()

    def started(self, info: dict) -> None:
        self.info, self.host, self.device_name = info, info["host"], info["device_name"]
        self.where["node"] = info["node_id"]

    def replace(self, say=print) -> bool:
        """A new actor in place of a lost one, started within REPLACE_TIMEOUT_S (Ray places
        it where the resources are), else False: none could be placed or started. No wait
        where the cluster has not the resources free; ``say`` gets what it waits for and how
        that ended."""
        self.loss_detail()  # the lost actor's stderr file, if no one asked for it
        who = f"actor {self.where['actor']}"
        free = self.ray.available_resources()
        need = {r: self.options.get(k) or 0 for k, r in (("num_cpus", "CPU"), ("num_gpus", "GPU"))}
        short = [f"{v:g} {r}" for r, v in need.items() if free.get(r, 0) < v]
        if short:
            say(
                f"ray: no replacement for {who}: it needs {', '.join(short)} and the cluster "
                f"has {free_text(free)} free; its rows go to the other actors"
            )
            return False
        say(f"ray: waiting up to {REPLACE_TIMEOUT_S:g} s for Ray to place a replacement {who}")
        try:
            self.launch()
            self.started(self.ray.get(self._info_ref, timeout=REPLACE_TIMEOUT_S))
        except self.ray.exceptions.RayError as exc:
            self._drop()
            say(f"ray: no replacement for {who} ({type(exc).__name__}); its rows go elsewhere")
            return False
        say(f"ray: {who} replaced on {self.host}")
        return True

    def call(self, msg: tuple, timeout_s: float | None):
        exceptions = self.ray.exceptions
        if self.actor is None:
            raise WorkerFailed(LOST, f"the actor was lost ({self.lost}) and not replaced")
        # the actor's worker process enforces --timeout itself (a timeout row, the actor
        # lives on); this wait only ends an actor that stopped answering altogether
        backstop = None if timeout_s is None else timeout_s + START_TIMEOUT_S
        try:
            answer = self.ray.get(self.actor.call.remote(wire(msg), timeout_s), timeout=backstop)
        except exceptions.GetTimeoutError:
            raise self._failed(
                LOST,
                f"no answer from the actor after {backstop:g} s (--timeout plus a worker "
                f"start); the actor was killed",
            ) from None
        except exceptions.RayActorError as exc:  # died: killed, its node or the head lost
            raise self._failed(LOST, f"actor lost ({exit_detail(exc)})") from None
        except exceptions.RayError as exc:  # the step raised in the actor, which lives on
            raise WorkerFailed(
                "crash", f"{type(exc).__name__}: {one_line(_ANSI.sub('', str(exc)))}"
            ) from None
        if answer[0] == "failed":
            raise WorkerFailed(answer[1], answer[2])
        return answer[1]

    def _failed(self, status: str, what: str) -> WorkerFailed:
        """The actor is gone (killed here if need be): the step's failure, said at once; its
        stderr is fetched by ``loss_detail`` (from a dead node that takes READ_TIMEOUT_S)."""
        self._drop()
        self.lost, self._detail_due = what, True
        return WorkerFailed(status, what)

    def loss_detail(self) -> str:
        """'; stderr: ...' of the actor lost last, once (before a replacement starts)."""
        if not self._detail_due:
            return ""
        self._detail_due = False
        return f"; stderr: {self._stderr_tail()}"

    def close(self) -> None:
        if self.actor is not None:  # its worker process exits on its own, then the actor
            try:
                self.ray.get(self.actor.close.remote(), timeout=CLOSE_WAIT_S + 5)
            except Exception:  # noqa: BLE001 - dead, or not answering: killed below
                pass
        self._drop()
        self._stderr_tail()  # removes the file

    # -- helpers ---------------------------------------------------------------------------
    def _drop(self) -> None:
        """Kill the actor (harmless if it is dead already); the next call starts another."""
        if self.actor is not None:
            try:
                self.ray.kill(self.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or Ray is shutting down
                pass
        self.actor = None

    def _stderr_tail(self) -> str:
        """The last actor's stderr file, read (and removed) on its own node; a file left on
        this machine by a node that died here is removed all the same."""
        path, node = self.info.get("err_path"), self.info.get("node_id")
        if not path:
            return "(no stderr: the actor never started)"
        self.info = {**self.info, "err_path": None}  # read once
        try:
            if node == self.ray.get_runtime_context().get_node_id():
                return _summarize(_read_and_remove(path))
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            task = self.ray.remote(_read_and_remove).options(
                num_cpus=0,
                max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            return _summarize(self.ray.get(task.remote(path), timeout=READ_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - the node itself may be gone
            if self.info.get("host") == socket.gethostname():  # its node ran on this machine
                _read_and_remove(path)
            return f"(unavailable: {type(exc).__name__})"


def _remove_stale(folder: str) -> None:
    """The stderr files of actors of this machine whose process is gone (killed with their
    node, which could not remove them)."""
    for name in os.listdir(folder):
        m = re.fullmatch(re.escape(ERR_FILE).replace(r"\{pid\}", r"(\d+)"), name)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            _read_and_remove(os.path.join(folder, name))
        except OSError:  # another user's: alive
            pass


def free_text(free: dict) -> str:
    """'CPU 0, GPU 0': the free CPUs and GPUs of the cluster."""
    return ", ".join(f"{k} {free.get(k, 0):g}" for k in ("CPU", "GPU"))


def _read_and_remove(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
        os.unlink(path)
    except OSError as exc:
        return f"(unreadable: {exc})"
    return text


def _summarize(text: str) -> str:
    """A dead actor's stderr on one line: its last words, the signal, the Python frames."""
    lines: list[str] = []
    for line in _ANSI.sub("", text).splitlines():
        line = line.strip()
        if not line or _NOISE.search(line):
            continue
        m = re.search(r"\*\*\* (SIG[A-Z]+) received", line)
        line = f"{m.group(1)} received" if m else line
        if line not in lines[-1:]:
            lines.append(line)
    return stderr_tail(" | ".join(lines))


def exit_detail(exc: BaseException) -> str:
    text = " ".join(_ANSI.sub("", str(exc)).split())
    for pattern in (r"Worker exit detail: (.*?\.)(?: |$)", r"The actor is dead because (.*?\.)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return type(exc).__name__
