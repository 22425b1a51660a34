"""Executors: where rows are measured. Every executor is a ``worker.Worker`` (one device's
rows, case by case: ``run_case(case, impls)`` yields each row as soon as it is final), so the
sweep never asks which transport carries its steps.

``start(kind, plan)`` is the one place that knows the kinds: ``local`` (a worker process,
``local.Subprocess``, or this process with --no-isolate, ``local.InProcess``) and ``ray`` (one
actor per device: ``ray_start``, ``ray_executor``). It returns a ``Pool`` whose executors exist
from then on; ``Pool.measure_devices`` has each measure its device (env.json ``devices`` and
``ceilings``) and then reads pct_peak against its own device's ceilings."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from attnbench.errors import ClusterLost, one_line
from attnbench.run.executing.local import InProcess, Subprocess
from attnbench.run.executing.worker import Worker, WorkerFailed, who
from attnbench.store.env import GPU_WHERE
from attnbench.store.schema import LOST


def triton_cache_dir() -> str:
    """Triton's default cache folder ($TRITON_HOME or ~, then .triton/cache), without
    importing triton."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


class Pool:
    """A sweep's executors; ``started`` is a line to print, or None."""

    def __init__(self, plan, compile_cache: tempfile.TemporaryDirectory):
        self.plan, self._compile_cache = plan, compile_cache
        self.executors: list[Worker] = []
        self.started: str | None = None
        self._leave = None  # how to leave the cluster the executors run on, if any
        self._watch = None  # set: the watch of the cluster's head ends

    def measure_devices(self) -> dict:
        """env.json's ``ceilings`` (the driver's device) and ``devices`` ({device_name: {hosts,
        actors, where (each executor's host, Ray node and actor, GPU index and UUID),
        versions, ceilings}}): each executor describes its device (Ray's actors all at once:
        each starts its worker process) and measures it (at once on GPUs, one after another
        on CPUs, which share a machine's memory bandwidth), per device name the best of its
        executors is kept (a ceiling is what the device can do), and each executor then reads
        pct_peak and bound against its device's."""
        plan = self.plan
        many = len(self.executors) > 1  # Ray's actors; the local executor stays in this
        # thread: a worker process started by another thread would die with that thread
        describe = lambda w: w.ask("device", plan.packages)  # noqa: E731
        entries = self._survivors(describe, many, "describing its device")
        measure = lambda w: w.ask("ceilings", plan.dtypes, plan.quick)  # noqa: E731
        measured = self._survivors(
            measure, many and plan.device.startswith("cuda"), "measuring its device"
        )
        executors = self.executors
        entries, measured = [entries[w] for w in executors], [measured[w] for w in executors]
        devices: dict[str, dict] = {}
        for worker, entry, ceilings in zip(executors, entries, measured):
            name, host = entry.pop("device_name"), entry.pop("host")
            worker.gpu = {k: entry.pop(k, None) for k in GPU_WHERE}  # each of its rows says it
            device = devices.setdefault(name, {"hosts": [], "actors": 0, "where": [], **entry})
            if host not in device["hosts"]:
                device["hosts"].append(host)
            device["actors"] += 1
            device["where"].append({"host": host, **worker.where})
            device["ceilings"] = _best(device.get("ceilings"), ceilings)
        for worker in executors:
            worker.use_ceilings(devices[worker.device_name]["ceilings"])
        from attnbench.run.executing.environment import device_name

        here = devices.get(device_name(plan.device)) or next(iter(devices.values()))
        return {"ceilings": here["ceilings"], "devices": devices}

    def _survivors(self, ask, at_once: bool, doing: str) -> dict[Worker, object]:
        """``ask(executor)`` of each executor: one lost meanwhile (a Ray actor whose node
        died) leaves the pool with a line saying so, as one lost later would; none left is
        ClusterLost, one line with each one's cause."""
        answers = dict(
            zip(self.executors, _each(self.executors, lambda w: _answer(w, ask), at_once))
        )
        lost = [(w, a) for w, a in answers.items() if isinstance(a, WorkerFailed)]
        lost = [(w, f"{one_line(a)}{w.loss_detail()}") for w, a in lost]
        for worker, _ in lost:
            self.executors.remove(worker)
            worker.close()
        if not self.executors:
            causes = "; ".join(f"{who(w)}: {one_line(a, 200)}" for w, a in lost)
            raise ClusterLost(
                f"every executor was lost while {doing}, before the first row ({causes}); "
                "nothing was written: check the cluster (ray status) and run the command again"
            )
        left = len(self.executors)
        for worker, answer in lost:
            print(
                f"lost: {who(worker)} while {doing} ({answer}); "
                f"going on with {left} executor{'s' if left != 1 else ''}",
                file=sys.stderr,
            )
        return {w: a for w, a in answers.items() if not isinstance(a, WorkerFailed)}

    def on_head_lost(self, lost) -> None:
        """With --executor ray: ``lost(address)`` is called (from another thread) when the
        cluster's head stops answering."""
        if self._leave is not None:
            from attnbench.run.executing import ray_cluster

            self._watch = ray_cluster.watch_head(lost)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.set()  # the sweep is over: the head going away is no loss now
        for ex in self.executors:
            ex.close()
        if self._leave is not None:
            self._leave()
        self._compile_cache.cleanup()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _each(executors: list[Worker], ask, at_once: bool) -> list:
    """``ask(executor)`` for each executor: in threads, all at once, or one after another."""
    if not at_once:
        return [ask(w) for w in executors]
    with ThreadPoolExecutor(len(executors)) as threads:
        return list(threads.map(ask, executors))


def _answer(worker: Worker, ask):
    """``ask(worker)``, or the WorkerFailed of an executor lost meanwhile."""
    try:
        return ask(worker)
    except WorkerFailed as exc:
        if exc.status != LOST:
            raise
        return exc


def _best(a: dict | None, b: dict) -> dict:
    """The better of two ceilings of one device (a per-dtype matmul rate, a bandwidth)."""
    if a is None:
        return b
    out = dict(a)
    out["matmul_tflops"] = {
        d: max(a["matmul_tflops"].get(d, 0.0), t) for d, t in b["matmul_tflops"].items()
    }
    out["copy_gb_s"] = max(a["copy_gb_s"], b["copy_gb_s"])
    out["contended"] = a.get("contended", False) and b.get("contended", False)
    return out


def start(kind: str, plan) -> Pool:
    """The executors of ``kind`` for ``plan`` (``plan.worker``, their one configuration):
    Ray's actors are started here (before anything is written: a bad address is a usage
    error). torch.compile gets a cache private to this sweep."""
    pool = Pool(plan, tempfile.TemporaryDirectory(prefix="attnbench-inductor-"))
    # torch.compile's cache private to this sweep (its workers inherit it): no kernel compiled
    # by another process, for other settings, can be picked up; an explicit setting wins
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", pool._compile_cache.name)
    # inductor points an unset TRITON_CACHE_DIR into its own cache folder (the temporary one
    # above), and every Triton kernel compiled after that (triton_flash's, its autotuning
    # results) would be lost with it: Triton's own cache stays where Triton keeps it
    os.environ.setdefault("TRITON_CACHE_DIR", triton_cache_dir())
    spec = plan.worker
    if kind != "ray":
        pool.executors = [Worker(spec, Subprocess(spec) if plan.isolate else InProcess(spec))]
        return pool
    from attnbench.run.executing import ray_cluster, ray_start

    started = time.perf_counter()
    try:
        address, actors = plan.ray
        transports = ray_start.start(address, spec, actors, plan.command)
    except BaseException:
        pool._compile_cache.cleanup()
        raise
    pool.executors = [Worker(spec, t) for t in transports]
    pool._leave = ray_cluster.shutdown
    n = len(transports)
    pool.started = (
        f"ray: {n} actor{'s' if n > 1 else ''} up in {time.perf_counter() - started:.1f} s "
        f"({', '.join(sorted({f'{t.device_name}@{t.host}' for t in transports}))}) on "
        f"{ray_cluster.joined()}"
    )
    return pool
