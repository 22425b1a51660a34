"""Joining Ray: start a local instance or join a cluster (``connect``, with the cause and the
fix when an address is wrong, unreachable or wants a token), size the actors to its devices
(``actor_options``), and leave it (``shutdown``). ``ray`` is imported only here and in
run/executing/ray_executor.py, when one of them is called, so attnbench works without it."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from attnbench import checkout
from attnbench.errors import UsageError
from attnbench.run.measuring.row import one_line

INSTALL_HINT = "pip install 'ray>=2.40'"  # the ray extra's own requirement: works from a wheel
CONNECT_TIMEOUT_S = 30.0  # joining a cluster that never answers
HEAD_LOST_S = 10.0  # the head's port refusing for this long: the cluster is lost (Ray: 60 s)
HEAD_POLL_S = 2.0  # how often the head's port is tried


def _import_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise UsageError(
            f"--executor ray needs Ray, which is not installed; install it with {INSTALL_HINT}"
        ) from None
    return ray


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


def _check_reachable(address: str, given: str) -> None:
    """A refused or unknown host:port fails here at once, instead of after Ray's retries;
    ``given`` names where the address came from (the flag, or RAY_ADDRESS)."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        host, port = address, "6379"
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise UsageError(f"{given}: cannot connect ({exc})") from None


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


def _auth_problem(given: str, exc: BaseException, logged: str) -> str | None:
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
            f"{given}: the cluster refused this process's Ray token "
            f"(RAY_AUTH_MODE=token): the token here ({where}) is missing or is not the "
            f"cluster's; copy the head's (`ray get-auth-token` on the head prints it)"
        )
    return (
        f"{given}: the cluster requires Ray's token authentication and this "
        f"process sent no token; run with RAY_AUTH_MODE=token and the cluster's token in "
        f"{where} (`ray get-auth-token` on the head prints it; docs/distributed.md)"
    )


def connect(address: str | None, command: str = "sweep"):
    """Join the cluster at ``address`` (``auto``, host:port, ray://host:port), else at
    RAY_ADDRESS when it is set (Ray's own convention), else start a private Ray instance
    here (never a cluster that ``ray start`` left running: Ray's ``address="local"``); what
    was joined and why is ``joined()``. Bad or unreachable addresses are a UsageError naming
    where the address came from (a token the cluster requires and did not get, with the
    fix), and a cluster that does not answer within CONNECT_TIMEOUT_S ends this process with
    one line and exit code 2 (nothing has been written by then). While joining, Ray's own
    log lines (one per failed attempt, from its C++ client) are held back: they are shown if
    the join succeeds, read for the cause if not."""
    given = f"--ray-address {address}"
    if not address and os.environ.get("RAY_ADDRESS", "").strip():
        address = os.environ["RAY_ADDRESS"].strip()
        given = f"RAY_ADDRESS={address}"
    if address:
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "1")  # one attempt, not 20
    ray = _import_ray()
    if address:
        _check_reachable(address, given)
    if ray.is_initialized():  # already connected (a program that drives sweeps itself)
        _joined[:] = ["the Ray instance this process had joined"]
        return ray
    _quiet_raylet_notices()
    kwargs = dict(log_to_driver=False, logging_level=logging.ERROR)
    if not address:
        ray.init(address="local", include_dashboard=False, **kwargs)
        _connected_here.append(True)
        _joined[:] = ["a private Ray instance started here (no --ray-address or RAY_ADDRESS)"]
        return ray
    _join(ray, address, given, command, kwargs)
    _connected_here.append(True)
    _joined[:] = [f"the cluster at {address} ({given.split('=')[0].split()[0]})"]
    return ray


def _join(ray, address: str, given: str, command: str, kwargs: dict) -> None:
    """ray.init at ``address``, within CONNECT_TIMEOUT_S, Ray's log lines held back."""
    sys.stderr.flush()
    stderr = os.dup(2)
    held = tempfile.TemporaryFile()

    def give_up() -> None:
        line = (
            f"attnbench {command}: error: {given}: no Ray cluster answered "
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
            _auth_problem(given, failure, logged)
            or f"{given}: cannot connect ({one_line(failure)})"
        ) from None
    sys.stderr.write(logged)


def joined() -> str:
    """What the last connect() joined, and why: 'the cluster at HOST:PORT (RAY_ADDRESS)'."""
    return _joined[0] if _joined else "Ray"


_joined: list[str] = []
_connected_here: list[bool] = []  # non-empty once connect() called ray.init


def actor_options(ray, device: str, threads: int | None, actors: int | None) -> tuple[int, dict]:
    """How many actors to start and the resources of each: one per GPU of the cluster on
    CUDA, else one per ``threads`` CPUs (1 by default); at most ``actors``."""
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
    return max(1, min(n, actors or n)), options


def _resource_text(resources: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if "node:" not in k)


def watch_head(lost: Callable[[str], None], address: str | None = None) -> threading.Event:
    """Call ``lost(address)`` from a thread of its own once the cluster's head (its GCS
    port; by default the one joined) has refused connections for HEAD_LOST_S: sooner than
    Ray, which gives up after a minute by ending this process with a message of its own.
    Setting the returned event ends the watch (the sweep is over: leaving the cluster, or a
    local instance shutting down, is no loss)."""
    stop = threading.Event()
    if address is None:
        import ray

        address = ray.get_runtime_context().gcs_address
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit():
        return stop  # Ray Client (ray://): its own connection, not watched here

    def poll() -> None:
        since = None
        while not stop.wait(HEAD_POLL_S):
            try:
                socket.create_connection((host, int(port)), timeout=HEAD_POLL_S).close()
                since = None
            except OSError:
                since = since or time.monotonic()
                if time.monotonic() - since >= HEAD_LOST_S and not stop.is_set():
                    lost(address)
                    return

    threading.Thread(target=poll, name="attnbench-head-watch", daemon=True).start()
    return stop


def actor_start_problem(exc: BaseException) -> str | None:
    """Why no actor started when it is this process's setting, with the fix (a cluster
    without token authentication, joined with RAY_AUTH_MODE=token, cancels every actor);
    else None (the actors were lost: ClusterLost)."""
    text = one_line(exc)
    if "cancelled before it started" in text and os.environ.get("RAY_AUTH_MODE") == "token":
        return (
            "the Ray actors were cancelled before they started: the cluster does not use "
            "token authentication and this process has RAY_AUTH_MODE=token; unset "
            "RAY_AUTH_MODE here, or restart the cluster with RAY_AUTH_MODE=token "
            "(docs/distributed.md)"
        )
    return None


def shutdown() -> None:
    """Leave Ray if connect() joined it: stops the local instance it started, or
    disconnects from the cluster."""
    import ray

    if _connected_here and ray.is_initialized():
        ray.shutdown()
        _connected_here.clear()
