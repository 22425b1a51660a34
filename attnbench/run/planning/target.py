"""Where a sweep runs, from its options: the executor kind, the device, the plugins and every
registered impl (``Target``), checked before anything is started or written."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench import plugins
from attnbench.errors import UsageError
from attnbench.options import OPTIONS, flag

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
