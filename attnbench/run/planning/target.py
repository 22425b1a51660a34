"""Where a sweep runs, from its options: the executor kind, the device, the plugins and every
registered impl (``Target``), checked before anything is started or written."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from attnbench import plugins
from attnbench.errors import UsageError
from attnbench.options import OPTIONS, flag
from attnbench.spec import Spec

RAY_ONLY = tuple(n for n, o in OPTIONS.items() if o.scope == "ray")  # need --executor ray


@dataclass(frozen=True)
class Target:
    """Where a sweep runs: the executor kind, the device, the plugins and every impl."""

    executor: str
    device: str
    plugins: list[str]
    impls: dict

    @classmethod
    def from_options(cls, opts: dict, *, dry_run: bool = False) -> Target:
        executor = opts.get("executor", "local")
        if executor != "ray":
            for name in RAY_ONLY:
                if name in opts:
                    raise UsageError(f"{flag(name)} needs --executor ray")
        elif opts.get("isolate") is False:
            raise UsageError("--no-isolate needs --executor local (Ray actors are always isolated)")
        device = check_device(opts.get("device"), local=executor == "local" and not dry_run)
        if opts.get("cuda_graph") and not device.startswith("cuda"):
            raise UsageError(
                f"--cuda-graph replays CUDA graphs, but the device is {device}; use --device "
                f"cuda or leave --cuda-graph out"
            )
        given = opts.get("plugin", [])
        for text in given:
            plugins.plugin_source(text)  # a missing plugin is bad input, before any work
        return cls(executor, device, given, plugins.discover(given))

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]


def check_device(text: str | None, local: bool = True) -> str:
    """The sweep's device; with ``local`` False (Ray, or a dry run) the GPUs may be elsewhere."""
    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not local and text.startswith("cuda:"):
        raise UsageError(
            f"--device {text}: with --executor ray give --device cuda (each actor owns one GPU)"
        )
    if local and text.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"--device {text}: no CUDA device is visible to torch "
            f"{torch.__version__}; use --device cpu"
        )
    return text


def refuse_gpu_grid(
    preset: str, spec: Spec, impls: list[str] | None, command: str, dry_run: bool
) -> None:
    """A GPU preset on a machine without one: UsageError with the grid's size (the impls
    named, else the preset's) and what to add: --device cuda to see its grid (--dry-run),
    --device cpu to run it here anyway."""
    what = f"the {preset} preset" if command != "sweep" else f"--preset {preset}"
    names = impls or spec.impls
    size = f"{len(spec.cases())} cases" + (f" x {len(names)} impls" if names else "")
    fix = (
        "add --device cuda to see its grid as a GPU would run it, or --device cpu to see it here"
        if dry_run
        else "run it on a GPU, or add --device cpu to run it here anyway"
    )
    raise UsageError(
        f"{what} is a GPU grid ({size} of {'/'.join(spec.dtype)}, N up to {max(spec.seq_len)}) "
        f"and no CUDA device is visible to torch {torch.__version__}; {fix}"
    )


def check_threads(threads: int | None) -> None:
    """--threads on this machine: at most its CPUs (more only time-slices them)."""
    cpus = os.cpu_count() or 1
    if threads is not None and threads > cpus:
        raise UsageError(
            f"--threads {threads}: this machine has {cpus} CPUs; give at most {cpus} (more "
            f"threads would take turns on them, and the times would measure that)"
        )
