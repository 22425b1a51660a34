"""Executors: where rows are measured. One protocol, so the sweep never asks which it has:

    host, device_name  the machine and the device that measure its rows
    prepare(case)      inputs and the float64 reference, once per case, outside any row's
                       timeout
    measure(impl)      one row (``row.Measured``); a failure of any kind is a row, never an
                       exception
    close()

``start(kind, plan)`` is the one place that knows the executor kinds: ``local`` (a worker
process, ``local.Subprocess``, or this process with --no-isolate, ``local.InProcess``) and
``ray`` (one actor per device, ``ray_executor``). It returns a ``Pool``: the executors, the
devices they measure on (env.json ``devices`` and ``ceilings``), and ``close``."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from typing import Protocol

from attnbench.case import Case
from attnbench.measure import ceilings
from attnbench.registry import Impl, plugin_source
from attnbench.run.local import InProcess, Subprocess
from attnbench.run.row import Measured

KINDS = ("local", "ray")


class Executor(Protocol):
    host: str | None  # the machine that measures (None until a Ray actor has started)
    device_name: str | None  # the device that measures: GPU name on CUDA, else CPU model

    def prepare(self, case: Case, impls: list[Impl]) -> None: ...
    def measure(self, impl: Impl) -> Measured: ...
    def close(self) -> None: ...


def triton_cache_dir() -> str:
    """Triton's default cache folder ($TRITON_HOME or ~, then .triton/cache), without
    importing triton."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


class Pool:
    """A sweep's executors of one kind; ``started`` is a line to print, or None."""

    def __init__(self, kind: str, plan, executors: list[Executor], started: str | None):
        self.kind, self.plan, self.executors, self.started = kind, plan, executors, started
        self._compile_cache = tempfile.TemporaryDirectory(prefix="attnbench-inductor-")

    def measure_devices(self) -> dict:
        """env.json's ``devices`` ({device_name: {hosts, actors, versions, ceilings}}) and
        ``ceilings`` (the driver's device). Each executor's settings then carry its device's
        ceilings (pct_peak, bound); local executors are made here, once they are known."""
        plan = self.plan
        if self.kind == "ray":  # each actor measures its own device; the driver's is one
            from attnbench.run import ray_executor
            from attnbench.store.env import device_name

            devices = ray_executor.measure_devices(
                self.executors, plan.dtypes, plan.device, plan.quick
            )
            here = devices.get(device_name(plan.device)) or next(iter(devices.values()))
            return {"devices": devices, "ceilings": here["ceilings"]}
        from attnbench.store.env import device_env

        measured = ceilings.measure(plan.dtypes, plan.device, quick=plan.quick)
        here = device_env(plan.device)
        devices = {
            here.pop("device_name"): {
                "hosts": [here.pop("host")],
                "actors": 1,
                **here,
                "ceilings": measured,
            }
        }
        settings = replace(
            plan.settings,
            matmul_tflops=measured["matmul_tflops"],
            copy_gb_s=measured["copy_gb_s"],
            ceilings_contended=measured["contended"],
        )
        opts = plan.opts
        self.executors = [
            Subprocess(
                plan.target.plugins,
                plan.seed,
                settings,
                opts.get("timeout"),
                opts.get("threads"),
                plan.device,
            )
            if plan.isolate
            else InProcess(plan.seed, settings, plan.device)
        ]
        return {"ceilings": measured, "devices": devices}  # env.json's order on one machine

    def close(self) -> None:
        for ex in self.executors:
            ex.close()
        if self.kind == "ray":
            from attnbench.run import ray_executor

            ray_executor.shutdown()
        self._compile_cache.cleanup()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(kind: str, plan) -> Pool:
    """The executors of ``kind`` for ``plan``: Ray's actors are started here (before anything
    is written: a bad address is a usage error), local ones once the device's ceilings are
    measured (``Pool.measure_devices``). torch.compile gets a cache private to this sweep."""
    pool = Pool(kind, plan, [], None)
    # torch.compile's cache private to this sweep (its workers inherit it): no kernel compiled
    # by another process, for other settings, can be picked up; an explicit setting wins
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", pool._compile_cache.name)
    # inductor points an unset TRITON_CACHE_DIR into its own cache folder (the temporary one
    # above), and every Triton kernel compiled after that (triton_flash's, its autotuning
    # results) would be lost with it: Triton's own cache stays where Triton keeps it
    os.environ.setdefault("TRITON_CACHE_DIR", triton_cache_dir())
    opts = plan.opts
    if kind == "ray":
        from attnbench.run import ray_executor

        started = time.perf_counter()
        try:
            pool.executors = ray_executor.start(
                opts.get("ray_address"),
                plugins=[plugin_source(p) for p in plan.target.plugins],
                seed=plan.seed,
                settings=plan.settings,
                timeout_s=opts.get("timeout"),
                device=plan.device,
                threads=opts.get("threads"),
                actors=opts.get("ray_actors"),
                command=plan.command,
            )
        except BaseException:
            pool._compile_cache.cleanup()
            raise
        n = len(pool.executors)
        pool.started = (
            f"ray: {n} actor{'s' if n > 1 else ''} up in "
            f"{time.perf_counter() - started:.1f} s "
            f"({', '.join(sorted({f'{e.device_name}@{e.host}' for e in pool.executors}))})"
        )
    elif "threads" in opts:
        import torch

        torch.set_num_threads(opts["threads"])
    return pool
