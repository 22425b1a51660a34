"""The Ray executor: one Ray actor per device (a GPU, or ``--threads`` CPUs), across the
machines of a Ray cluster, behind the executor protocol of ``executors.py`` (whose ``start``
starts it for ``--executor ray``).

``RayActor`` is the proxy the sweep drives, one per device; it owns one ``_Actor`` at a time,
which runs whole cases on its device in a worker process of its own (the local executor's
``Subprocess``: inputs and the float64 reference made once per case) and sends back rows.
Impls travel by name: each actor loads the registry itself. An impl that crashes or hangs
costs its row, as on one machine (status crash with the signal, or timeout), and a fresh
worker; an actor that dies itself (its node lost, killed from outside) costs the row in
flight and is replaced. Nothing is retried by Ray, so no row runs twice.

``start`` starts or joins Ray and returns the proxies; ``measure_devices`` has every actor
measure its device's ceilings and returns env.json's ``devices``. ``ray`` is imported only
here, when one of them is called, so attnbench works without it."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import sys
import tempfile
import threading

from attnbench import checkout
from attnbench.case import Case
from attnbench.errors import UsageError
from attnbench.registry import Impl
from attnbench.run import heap
from attnbench.run.local import CLOSE_WAIT_S, Subprocess
from attnbench.run.row import Measured, Settings, failed, one_line

INSTALL_HINT = "pip install 'ray>=2.40'"  # the ray extra's own requirement: works from a wheel
CONNECT_TIMEOUT_S = 30.0  # joining a cluster that never answers
START_TIMEOUT_S = 300.0  # an actor's start-up: import torch (and a CUDA context)
READ_TIMEOUT_S = 10.0  # fetching a dead actor's stderr from its node
STDERR_TAIL_CHARS = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a dead actor's stderr without Ray's own log lines, address dumps and faulthandler's module list
_NOISE = re.compile(
    r"logging\.cc:\d+:|^(PC: )?@ +0x|^Extension modules:|^Stack \(most recent|"
    r"^File \".*/site-packages/ray/|^:(job_id|actor_name|task_name):"
)


def _import_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise UsageError(
            f"--executor ray needs Ray, which is not installed; install it with {INSTALL_HINT}"
        ) from None
    return ray


class _Actor:
    """Runs inside a Ray worker process and owns one device. It measures rows in a worker
    process of its own (the local executor's ``Subprocess``), so an impl that crashes or
    hangs costs its row, named as on one machine (the signal, the worker's stderr), and the
    actor lives on. Its own stderr goes to a file, emptied before each row, so that a crash
    row can say how the actor died, if it does (its node lost, killed from outside)."""

    def __init__(
        self,
        plugins: list[str],
        seed: int,
        device: str,
        threads: int | None,
        timeout_s: float | None = None,
    ):
        self.err_path = os.path.join(
            tempfile.gettempdir(), f"attnbench-ray-actor-{os.getpid()}.err"
        )
        fd = os.open(self.err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        import torch

        if threads:
            torch.set_num_threads(threads)
        from attnbench import registry

        self.impls = registry.discover(plugins)
        heap.freeze_startup()  # a row's garbage collection then skips the start-up's objects
        self.plugins, self.seed, self.device = plugins, seed, device
        self.threads, self.timeout_s = threads, timeout_s
        self.worker: Subprocess | None = None

    def info(self) -> dict:
        import ray

        from attnbench.store.env import device_env

        return {
            **device_env(self.device),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "err_path": self.err_path,
        }

    def ceilings(self, dtypes: list[str], quick: bool) -> dict:
        from attnbench.measure import ceilings

        return ceilings.measure(dtypes, self.device, quick=quick)

    def prepare(self, case: Case, build: bool, settings: Settings) -> None:
        if self.worker is None or self.worker.settings != settings:  # the ceilings came in
            self.close()
            self.worker = Subprocess(
                self.plugins, self.seed, settings, self.timeout_s, self.threads, self.device
            )
        self.worker.start_case(case, build)

    def measure(self, name: str) -> Measured:
        from attnbench.store.env import device_name

        os.ftruncate(2, 0)  # the file holds this row's output only
        measured = self.worker.measure(self.impls[name])
        measured.row.update(host=socket.gethostname(), device_name=device_name(self.device))
        return measured

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self.worker = None


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
    text = " | ".join(lines)
    if len(text) > STDERR_TAIL_CHARS:
        return "..." + text[-STDERR_TAIL_CHARS:]
    return text or "(empty)"


def _exit_detail(exc: BaseException) -> str:
    text = " ".join(_ANSI.sub("", str(exc)).split())
    for pattern in (r"Worker exit detail: (.*?\.)(?: |$)", r"The actor is dead because (.*?\.)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return type(exc).__name__


class RayActor:
    """The proxy of one device's actor: the executor protocol, one row at a time."""

    def __init__(
        self,
        ray,
        options: dict,
        args: tuple,
        settings: Settings,
        timeout_s: float | None,
    ):
        self.ray, self.options, self.args = ray, options, args
        self.settings, self.timeout_s = settings, timeout_s
        self.actor = None
        self.info: dict = {}
        self.case: Case | None = None
        self.build = False
        self.broken: str | None = None
        self.host: str | None = None
        self.device_name: str | None = None
        self.starts = 0

    # -- start-up --------------------------------------------------------------------------
    def launch(self) -> None:
        cls = self.ray.remote(_Actor).options(
            max_restarts=0, max_task_retries=0, **self.options
        )  # a dead actor is replaced here, after its crash row, never restarted by Ray
        self.actor = cls.remote(*self.args)
        self._info_ref = self.actor.info.remote()

    def started(self, info: dict) -> None:
        self.info, self.starts = info, self.starts + 1
        self.host, self.device_name = info["host"], info["device_name"]

    def _start(self) -> None:
        self.launch()
        self.started(self.ray.get(self._info_ref, timeout=START_TIMEOUT_S))
        if self.case is not None:  # a replacement: the case again
            self.ray.get(self.actor.prepare.remote(self.case, self.build, self.settings))

    # -- the protocol ----------------------------------------------------------------------
    def prepare(self, case: Case, impls: list[Impl]) -> None:
        self.case, self.broken = case, None
        self.build = any(not i.reasons(case) for i in impls)
        exceptions = self.ray.exceptions
        try:
            if self.actor is None:
                self._start()  # prepares self.case
            else:  # untimed, like the subprocess worker's prepare
                self.ray.get(self.actor.prepare.remote(case, self.build, self.settings))
        except exceptions.RayActorError as exc:
            self.broken = f"actor died ({_exit_detail(exc)}); stderr: {self._stderr_tail()}"
            self._drop()
        except exceptions.RayError as exc:  # a start-up timeout, or prepare raised
            self.broken = f"{type(exc).__name__}: {one_line(_ANSI.sub('', str(exc)))}"
            if isinstance(exc, exceptions.GetTimeoutError):
                self._drop()

    def measure(self, impl: Impl) -> Measured:
        if self.broken:
            return failed(impl, self.case, "crash", f"while preparing the case: {self.broken}")
        exceptions = self.ray.exceptions
        try:
            if self.actor is None:
                self._start()
        except exceptions.RayActorError as exc:
            self._drop()
            return failed(
                impl,
                self.case,
                "crash",
                f"the replacement actor died while preparing the case ({_exit_detail(exc)}); "
                f"stderr: {self._stderr_tail()}",
            )
        except (exceptions.GetTimeoutError, exceptions.RayError) as exc:
            self._drop()
            return failed(
                impl,
                self.case,
                "crash",
                f"no replacement actor could be started ({type(exc).__name__})",
            )
        ref = self.actor.measure.remote(impl.name)
        # the actor's worker process enforces --timeout itself (a timeout row, the actor
        # lives on); this wait only ends an actor that stopped answering altogether
        backstop = None if self.timeout_s is None else self.timeout_s + START_TIMEOUT_S
        try:
            return self.ray.get(ref, timeout=backstop)
        except exceptions.GetTimeoutError:
            self._drop()
            return failed(
                impl,
                self.case,
                "timeout",
                f"no answer from the actor after {backstop:g} s (--timeout plus a worker "
                f"start); the actor was killed; stderr: {self._stderr_tail()}",
            )
        except exceptions.RayActorError as exc:  # died: segfault, abort, killed, node lost
            reason = f"actor died ({_exit_detail(exc)}); stderr: {self._stderr_tail()}"
            self._drop()
            return failed(impl, self.case, "crash", reason)

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
        """The last actor's stderr file, read (and removed) on its own node."""
        path, node = self.info.get("err_path"), self.info.get("node_id")
        if not path:
            return "(no stderr: the actor never started)"
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
            return f"(unavailable: {type(exc).__name__})"


def _quiet_raylet_notices() -> None:
    """Ray's driver prints every worker death as "(raylet) A worker died..." on stdout,
    whatever log_to_driver says; the crash row's reason already says it. This filters them
    through Ray's private printing hook; if that moves, the notices come back, nothing else."""
    try:
        import ray._private.worker as rw
    except ImportError:
        return
    original = getattr(rw, "print_to_stdstream", None)
    if original is None or getattr(original, "_attnbench", False):
        return

    def filtered(data, *args, **kwargs):
        if isinstance(data, dict) and data.get("pid") == "raylet":
            return None
        return original(data, *args, **kwargs)

    filtered._attnbench = True
    rw.print_to_stdstream = filtered


def _check_reachable(address: str) -> None:
    """A refused or unknown host:port fails here at once, instead of after Ray's retries."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        host, port = address, "6379"
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise UsageError(f"--ray-address {address}: cannot connect ({exc})") from None


def _actor_env() -> dict:
    """What an actor takes from this process's environment: attnbench's own settings
    (ATTNBENCH_*), torch.compile's private cache, and, when this attnbench is a checkout,
    its folder on PYTHONPATH (so the actors import the same code)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("ATTNBENCH_") or k == "TORCHINDUCTOR_CACHE_DIR"
    }
    root = checkout.root()
    if root is not None:
        paths = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return {"env_vars": env}


_AUTH_FAILURE = re.compile(r"InvalidAuthToken|Unauthenticated|AuthenticationError")


def _auth_problem(address: str, exc: BaseException, logged: str) -> str | None:
    """The cause and the fix when joining failed on Ray's token authentication (Ray >= 2.52:
    a cluster started where a token exists, ~/.ray/auth_token, requires one; Ray sends it to
    an address it is given only with RAY_AUTH_MODE=token), else None."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = logged + " ".join(f"{type(e).__name__}: {e}" for e in chain)
    if not _AUTH_FAILURE.search(text):
        return None
    where = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return (
            f"--ray-address {address}: the cluster refused this process's Ray token "
            f"(RAY_AUTH_MODE=token): the token here ({where}) is missing or is not the "
            f"cluster's; copy the head's (`ray get-auth-token` on the head prints it)"
        )
    return (
        f"--ray-address {address}: the cluster requires Ray's token authentication and this "
        f"process sent no token; run with RAY_AUTH_MODE=token and the cluster's token in "
        f"{where} (`ray get-auth-token` on the head prints it; docs/distributed.md)"
    )


def connect(address: str | None, command: str = "sweep"):
    """Start a local Ray instance (``address`` None) or join a cluster (``auto``, host:port,
    ray://host:port). Bad or unreachable addresses are a UsageError (a token the cluster
    requires and did not get, with the fix), and a cluster that does not answer within
    CONNECT_TIMEOUT_S ends this process with one line and exit code 2 (nothing has been
    written by then). While joining, Ray's own log lines (one per failed attempt, from its C++
    client) are held back: they are shown if the join succeeds, read for the cause if not."""
    if address:
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "1")  # one attempt, not 20
    ray = _import_ray()
    if address:
        _check_reachable(address)
    if ray.is_initialized():  # already connected (a program that drives sweeps itself)
        return ray
    _quiet_raylet_notices()
    kwargs = dict(log_to_driver=False, logging_level=logging.ERROR)
    if not address:
        ray.init(include_dashboard=False, **kwargs)
        _connected_here.append(True)
        return ray
    sys.stderr.flush()
    stderr = os.dup(2)
    held = tempfile.TemporaryFile()

    def give_up() -> None:
        line = (
            f"attnbench {command}: error: --ray-address {address}: no Ray cluster answered "
            f"within {CONNECT_TIMEOUT_S:g} s\n"
        )
        os.write(stderr, line.encode())
        os._exit(2)

    watchdog = threading.Timer(CONNECT_TIMEOUT_S, give_up)
    watchdog.daemon = True
    failure = None
    os.dup2(held.fileno(), 2)
    watchdog.start()
    refused = (ConnectionError, ValueError, RuntimeError, TimeoutError, ray.exceptions.RayError)
    try:
        ray.init(address=address, **kwargs)
    except refused as exc:
        failure = exc
    finally:
        watchdog.cancel()
        sys.stderr.flush()
        os.dup2(stderr, 2)
        os.close(stderr)
    held.seek(0)
    logged = held.read().decode(errors="replace")
    held.close()
    if failure is not None:
        raise UsageError(
            _auth_problem(address, failure, logged)
            or f"--ray-address {address}: cannot connect ({one_line(failure)})"
        ) from None
    sys.stderr.write(logged)
    _connected_here.append(True)
    return ray


_connected_here: list[bool] = []  # non-empty once connect() called ray.init


def start(
    address: str | None,
    *,
    plugins: list[str],
    seed: int,
    settings: Settings,
    timeout_s: float | None,
    device: str,
    threads: int | None,
    actors: int | None = None,
    command: str = "sweep",
) -> list[RayActor]:
    """Connect to Ray and start one actor per device: every GPU of the cluster on CUDA,
    else one per ``threads`` CPUs (1 by default); at most ``actors``. Returns their proxies,
    started."""
    ray = connect(address, command)
    resources = ray.cluster_resources()
    if device.startswith("cuda"):
        n = int(resources.get("GPU", 0))
        if n == 0:
            raise UsageError(
                "--device cuda --executor ray: the Ray cluster has no GPU "
                f"(resources: {_resource_text(resources)})"
            )
        options = dict(num_gpus=1, num_cpus=threads or 1)
    else:
        threads = threads or 1
        cpus = resources.get("CPU", 0)
        if cpus < threads:
            raise UsageError(
                f"--threads {threads}: the Ray cluster has {cpus:g} CPUs; one actor needs {threads}"
            )
        n = int(cpus // threads)
        options = dict(num_cpus=threads)
    options["runtime_env"] = _actor_env()
    n = max(1, min(n, actors or n))
    args = ([str(p) for p in plugins], seed, device, threads, timeout_s)
    proxies = [RayActor(ray, options, args, settings, timeout_s) for _ in range(n)]
    for proxy in proxies:  # all start at once
        proxy.launch()
    try:
        infos = ray.get([p._info_ref for p in proxies], timeout=START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        for proxy in proxies:
            proxy.close()
        raise UsageError(
            f"Ray did not start {n} actors ({options}) within {START_TIMEOUT_S:g} s; "
            f"cap them with --ray-actors"
        ) from None
    except ray.exceptions.RayActorError as exc:
        for proxy in proxies:
            proxy.close()
        raise UsageError(f"a Ray actor failed to start: {one_line(exc)}") from None
    for proxy, info in zip(proxies, infos):
        proxy.started(info)
    return proxies


def _resource_text(resources: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if "node:" not in k)


def measure_devices(
    proxies: list[RayActor], dtypes: list[str], device: str, quick: bool
) -> dict[str, dict]:
    """Every actor measures its device's ceilings (at once on GPUs, one after another on
    CPUs, which share a machine's memory bandwidth); per device name the best of its actors
    is kept, as a ceiling is what the device can do. Each proxy's settings then carry its
    device's matmul rates, so pct_peak reads every row against the device that ran it.
    Returns env.json's ``devices``: {device_name: {hosts, versions, ceilings}}."""
    ray = proxies[0].ray
    refs = []
    for proxy in proxies:
        refs.append(proxy.actor.ceilings.remote(dtypes, quick))
        if not device.startswith("cuda"):
            ray.get(refs[-1])
    measured = ray.get(refs)
    devices: dict[str, dict] = {}
    for proxy, ceilings in zip(proxies, measured):
        entry = devices.setdefault(
            proxy.device_name,
            {
                "hosts": [],
                "actors": 0,
                **{k: v for k, v in proxy.info.items() if k not in _PRIVATE},
            },
        )
        entry.pop("host", None)
        if proxy.host not in entry["hosts"]:
            entry["hosts"].append(proxy.host)
        entry["actors"] += 1
        entry["ceilings"] = _best(entry.get("ceilings"), ceilings)
    for proxy in proxies:
        ceilings = devices[proxy.device_name]["ceilings"]
        proxy.settings = dataclasses.replace(
            proxy.settings,
            matmul_tflops=ceilings["matmul_tflops"],
            copy_gb_s=ceilings["copy_gb_s"],
            ceilings_contended=ceilings.get("contended", False),
        )
    return devices


_PRIVATE = ("pid", "node_id", "err_path", "device_name")


def _best(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    out = dict(a)
    out["matmul_tflops"] = {
        d: max(a["matmul_tflops"].get(d, 0.0), t) for d, t in b["matmul_tflops"].items()
    }
    out["copy_gb_s"] = max(a["copy_gb_s"], b["copy_gb_s"])
    out["contended"] = a.get("contended", False) and b.get("contended", False)
    return out


def shutdown() -> None:
    """Leave Ray if connect() joined it: stops the local instance it started, or
    disconnects from the cluster."""
    import ray

    if _connected_here and ray.is_initialized():
        ray.shutdown()
        _connected_here.clear()
