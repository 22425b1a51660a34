"""What a sweep will do, from its options (flags over a sweep file, already parsed by
options.py), given where it runs (run/planning/target.py): what it runs (``Plan``: spec, cases,
impls, grid, settings) and how (``RunOptions``). Every check of the options' combinations happens
here or in the target, before anything is started or written; a bad combination is one
UsageError line."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from datetime import datetime

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.errors import UsageError
from attnbench.measure import allocator
from attnbench.measure.memory import device_memory_bytes
from attnbench.measure.timing import TimerConfig
from attnbench.options import MEASURE_OPTIONS, as_text
from attnbench.plugins import records
from attnbench.run.executing.worker import WorkerSpec
from attnbench.run.measuring.inputs import input_bytes
from attnbench.run.measuring.layer_module import try_factory
from attnbench.run.measuring.row import Settings
from attnbench.run.planning.selection import (
    check_profile_filter,
    left_out_summary,
    left_out_text,
    select_impls,
    unfit_lines,
)
from attnbench.run.planning.target import Target, check_threads, refuse_gpu_grid
from attnbench.run.sweep import run_sweep
from attnbench.spec import GPU_PRESETS, SPEC_OPTIONS, Spec
from attnbench.store.results import check_resumable
from attnbench.store.rundir import RunDir

DRY_RUN_CASES = 10  # --dry-run names this many cases, then counts the rest


@dataclass(frozen=True)
class RunOptions:
    """The options that set how the sweep runs rather than what it measures, typed once."""

    seed: int = 0
    isolate: bool = True  # rows measured in a worker process (--timeout needs one)
    timeout_s: float | None = None
    threads: int | None = None
    group_by_device_name: bool = True
    ray_address: str | None = None  # None: a local Ray instance
    ray_actors: int | None = None  # None: one per device
    retry: tuple[str, ...] = ()  # --retry: the statuses a resumed run runs again
    measured: dict = field(default_factory=dict)  # the measure-scope options given, as text

    @classmethod
    def from_options(cls, opts: dict) -> RunOptions:
        return cls(
            seed=opts.get("seed", 0),
            isolate=opts.get("isolate", True) or "timeout" in opts,
            timeout_s=opts.get("timeout"),
            threads=opts.get("threads"),
            group_by_device_name=opts.get("group_by_device_name", True),
            ray_address=opts.get("ray_address"),
            ray_actors=opts.get("ray_actors"),
            retry=tuple(opts.get("retry", ())),
            measured={k: as_text(opts[k]) for k in MEASURE_OPTIONS if k in opts},
        )


@dataclass
class Plan:
    """A checked sweep: its target, how it runs, spec, cases, the impls to run and those left
    out (name -> why), and the measuring settings. Nothing below it reads the options."""

    target: Target
    run: RunOptions
    command: str
    preset: str
    spec: Spec
    cases: list[Case]
    impls: list
    left_out: dict[str, str]
    settings: Settings = field(default_factory=Settings)

    @classmethod
    def from_options(
        cls,
        opts: dict,
        target: Target,
        *,
        command: str = "sweep",
        default_preset: str | None,
        dry_run: bool = False,
    ) -> Plan:
        device = target.device
        preset = (
            opts.get("preset") or default_preset or ("gpu" if device.startswith("cuda") else "cpu")
        )
        spec = Spec.from_preset(
            preset,
            device,
            **{k: opts.get(k) for k in SPEC_OPTIONS},
            rep_ms=[opts["rep_ms"]] if "rep_ms" in opts else None,
        )
        if preset in GPU_PRESETS and device == "cpu" and "device" not in opts:
            refuse_gpu_grid(preset, spec, opts.get("impls"), command, dry_run)
        cases = spec.cases()
        if target.executor == "local":  # a Ray cluster's devices are not this machine's
            check_fits(cases, device)
            check_threads(opts.get("threads"))
        selected, left_out = select_impls(opts.get("impls"), target.impls, spec, cases)
        if not selected:
            raise UsageError(
                f"no impl can run any case of this grid on {device}; name impls with --impls "
                f"(see attnbench list)"
            )
        check_profile_filter(opts.get("profile"), selected, cases)
        for impl in selected:
            try_factory(impl, cases)  # a LayerModule of the wrong kinds: once, not per row
        settings = Settings(
            timer=TimerConfig(rep_ms=spec.rep_ms[0], cuda_graph=opts.get("cuda_graph", False)),
            profile=opts.get("profile"),
            malloc_tunables=opts.get("malloc_tunables", True),
        )
        run = RunOptions.from_options(opts)
        return cls(target, run, command, preset, spec, cases, selected, left_out, settings)

    @property
    def device(self) -> str:
        return self.target.device

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def isolate(self) -> bool:
        return self.run.isolate

    @property
    def worker(self) -> WorkerSpec:
        """The workers' one configuration (run/executing/worker.py)."""
        return WorkerSpec(
            plugins=tuple(str(plugins.plugin_source(p)) for p in self.target.plugins),
            seed=self.seed,
            settings=self.settings,
            timeout_s=self.run.timeout_s,
            threads=self.run.threads,
            device=self.device,
        )

    @property
    def ray(self) -> tuple[str | None, int | None]:
        """--ray-address and --ray-actors (None: a local Ray instance; one actor per device)."""
        return self.run.ray_address, self.run.ray_actors

    @property
    def baseline(self) -> str | None:
        """The impl speedups are relative to: the preset's (the race's sdpa_flash), else the
        registered one."""
        if self.spec.baseline in {i.name for i in self.impls}:
            return self.spec.baseline
        return registry.baseline(self.impls)

    @property
    def quick(self) -> bool:
        """A short timer budget: the ceilings are measured quickly too."""
        return self.spec.rep_ms[0] < 50

    @property
    def packages(self) -> tuple[str, ...]:
        """The modules the plan's impls require (their versions go into env.json)."""
        return tuple(sorted({m for i in self.impls for m in i.requires}))

    @property
    def dtypes(self) -> list[str]:
        return sorted({c.dtype for c in self.cases})

    @property
    def grid(self) -> dict:
        """What the run sweeps (grid.json); a resumed run must sweep the same."""
        return {
            "preset": self.preset,
            "device": self.device,
            "seed": self.seed,
            "rep_ms": self.spec.rep_ms[0],
            "impls": [i.name for i in self.impls],
            "cases": [c.label() for c in self.cases],
        }

    def default_run_id(self) -> str:
        return f"{datetime.now():%Y%m%d-%H%M%S}-{self.target.device_type}-{self.preset}"

    def run_dir(self, results_dir, run_id: str | None, *, resume: bool) -> tuple[str, RunDir]:
        """The run's id and folder (RunDir.choose), and the settings' traces folder in it."""
        run_id, run = RunDir.choose(
            results_dir, run_id, resume=resume, grid=self.grid, default_id=self.default_run_id()
        )
        if resume:
            check_resumable(run.path)  # before anything is cut, rewritten or written
        self.settings = replace(self.settings, traces_dir=run.traces)
        return run_id, run

    def env(self, argv: list[str]) -> dict:
        """env.json's fields that the plan knows (the machine's: executing/environment.py)."""
        from attnbench.run.executing.environment import collect_env

        argv = ["attnbench", self.command, *argv]
        env = collect_env(argv, self.seed, self.device, self.packages)
        env["impls"] = {
            i.name: {"source": i.source, "baseline": i.baseline, "color": i.color}
            for i in self.impls
        }
        env["plugins"] = records(self.target.plugins)  # report and repro load them again
        env["baseline"] = self.baseline
        env["options"] = dict(self.run.measured)  # the reproducer's measuring flags
        env["not_run"] = self.left_out
        profile = self.settings.profile
        env["profile"] = None if profile is None else list(profile)
        env["malloc"] = allocator.describe(self.settings.malloc_tunables, self.isolate)
        return env

    def start_text(self, run: RunDir, done: int) -> str:
        """The lines printed as the run starts: its size and folder, and impls left out."""
        text = f"{len(self.cases)} cases x {len(self.impls)} impls on {self.device} -> {run}"
        text += f" ({done} rows already done)" if done else ""
        if self.left_out:
            text += f"\n{left_out_summary(self.left_out, self.target.impls)}"
        return "\n".join([text, *unfit_lines(self.impls, self.cases)])

    def dry_run_text(self) -> str:
        cases, selected = self.cases, self.impls
        shown = [f"  {c.label()}" for c in cases[:DRY_RUN_CASES]]
        more = len(cases) - len(shown)
        lines = [
            f"dry run: {len(cases)} cases x {len(selected)} impls = "
            f"{len(cases) * len(selected)} rows on {self.device} (nothing run, nothing written)",
            f"impls: {', '.join(i.name for i in selected)}",
            "cases:",
            *shown,
            *([f"  ... and {more} more"] if more > 0 else []),
        ]
        lines += [left_out_text(self.left_out)] if self.left_out else []
        return "\n".join(lines + unfit_lines(self.impls, self.cases))

    def sweep(
        self, run: RunDir, run_id: str, lanes: list, done, no_progress: bool, row_lines: bool
    ) -> list[dict]:
        """Every row not ``done``, measured by the executors ``lanes`` into ``run``."""
        return run_sweep(
            self.cases,
            self.impls,
            run.path,
            lanes,
            run_id=run_id,
            seed=self.seed,
            baseline=self.baseline,
            done=done,
            progress=not (no_progress or row_lines),
            row_lines=row_lines,
            group_by_device_name=self.run.group_by_device_name,
        )

    def interrupted_text(self, argv: list[str], run: RunDir, run_id: str, named: bool) -> str:
        """What Ctrl-C prints: where the finished rows are, and the command that continues."""
        again = self.resume_command(argv, run_id, named)
        return f"\ninterrupted; every finished row is in {run.results}. Continue with: {again}"

    def resume_command(self, argv: list[str], run_id: str, named: bool) -> str:
        """The command that continues this run (``named``: argv has --run-id already)."""
        resume = "" if "--resume" in argv else " --resume"
        return f"attnbench {self.command} {' '.join(argv)}{resume}" + (
            "" if named else f" --run-id {run_id}"
        )


def check_fits(cases: list[Case], device: str) -> None:
    """The largest case's inputs must fit in the device's memory: a grid whose inputs cannot
    is bad input, refused before the first row (drawing them could take the machine down)."""
    limit = device_memory_bytes(device)
    if limit is None or not cases:
        return
    big = max(cases, key=input_bytes)
    if input_bytes(big) > limit:
        raise UsageError(
            f"the inputs of case {big.label()} take {input_bytes(big) / 2**30:,.1f} GiB, more "
            f"than the {limit / 2**30:,.1f} GiB of {device} memory; use a smaller --batch, "
            f"--heads or --seq-len"
        )


def warn_if_busy(device: str) -> str | None:
    """A warning when other processes load the CPU that a CPU sweep times on, else None."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if device == "cpu" and load > 0.5 * (os.cpu_count() or 1):
        return (
            f"warning: load average {load:.1f} on {os.cpu_count()} cores; other processes "
            f"will disturb CPU timings (see --threads)"
        )
    return None
