"""The one worker: a case in, its rows out, whatever transport carries the work.

``Worker`` is the state machine every executor runs in the sweep's process: prepare a case
(inputs and the float64 reference, outside any row's timeout), check each impl once, time the
impls that passed in interleaved rounds with the speed anchor (round-robin, the order rotated
each round; on a CPU the impls take turns sample by sample within a round), then finish each
(its row: time, memory, profile, and its speedup over the baseline's rounds). Each is a
step of the server (``steps.Steps``); a crash or a hang of a step is that impl's row (status
crash / timeout; a shared CPU round that failed is taken again impl by impl, which names the
impl), and the next step reaches a fresh server, which says it is unprepared: the worker
prepares the case again there and the rounds go on without the failed impl. A case whose
preparation fails makes every runnable row of it a failure (PREPARING). Its configuration is
one frozen ``WorkerSpec``.

The transports carry a step to a ``Steps`` server and back (``call(msg, timeout_s)``, raising
``WorkerFailed``): this process (``local.InProcess``), a worker process over a pipe
(``local.Subprocess``), a Ray actor (``ray_executor.RayActor``). The sweep drives ``Worker``s
and never asks which transport they have."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.measure.paired import round_medians
from attnbench.registry import Impl
from attnbench.run.measuring.failed import Measured, failed_row
from attnbench.run.measuring.row import Settings, support_reasons
from attnbench.store.env import GPU_WHERE
from attnbench.store.schema import LOST

PREPARING = "while preparing the case"  # the reason's start of a case that could not be made
UNPREPARED = "unprepared"  # a server's answer to a step of a case it has not prepared
ANCHOR = "anchor"  # the speed anchor's place in the rounds
TOGETHER = "together"  # CPU: the impls' place in the rounds, taking turns sample by sample


@dataclass(frozen=True)
class WorkerSpec:
    """A worker's configuration, whole: what it loads, how it measures, how long a step may
    take, torch's CPU threads in it (None: torch's choice), and its device."""

    plugins: tuple[str, ...] = ()
    seed: int = 0
    settings: Settings = Settings()
    timeout_s: float | None = None
    threads: int | None = None
    device: str = "cpu"

    def with_ceilings(self, ceilings: dict) -> WorkerSpec:
        return replace(self, settings=self.settings.with_ceilings(ceilings))


class PrepareFailed(NamedTuple):
    """A server's answer to a prepare step whose case could not be made (its server lives)."""

    status: str  # oom or error
    reason: str


class WorkerFailed(AttnbenchError):
    """A step that ended its server: status crash or timeout, and why; LOST when the
    executor itself is gone (the sweep gives the rest of its family to another)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Transport(Protocol):
    host: str | None  # the machine that measures (None until a Ray actor has started)
    device_name: str | None  # the device that measures: GPU name on CUDA, else CPU model
    where: dict  # what a row records of where it ran beyond the host: a Ray actor's node

    def call(self, msg: tuple, timeout_s: float | None):
        """The server's answer to ``msg``, or WorkerFailed; after a WorkerFailed the next
        call reaches a fresh server."""

    def replace(self, say=print) -> bool:
        """After a LOST step: whether a replacement started (False: it cannot be replaced);
        ``say`` gets a line on what it waits for."""

    def loss_detail(self) -> str:
        """After a LOST step, once: what was learnt of the loss since ('; stderr: ...' of a
        lost Ray actor, fetched from its node); '' where nothing more is learnt."""

    def close(self) -> None: ...


class Worker:
    """One device's rows, case by case (the executor protocol of the sweep)."""

    def __init__(self, spec: WorkerSpec, transport: Transport):
        self.spec, self.transport = spec, transport
        self.gpu: dict = {}  # its GPU's index and UUID (Pool.measure_devices asks the device)
        self.case: Case | None = None
        self.broken: WorkerFailed | None = None

    @property
    def host(self) -> str | None:
        return self.transport.host

    @property
    def device_name(self) -> str | None:
        return self.transport.device_name

    @property
    def where(self) -> dict:
        """What each row records of where it ran: the transport's node and actor, if it has
        them (a Ray actor), and the GPU."""
        return {**self.transport.where, **self.gpu}

    def use_ceilings(self, ceilings: dict) -> None:
        """Rows from now on read pct_peak and bound against ``ceilings`` (the device's)."""
        self.spec = self.spec.with_ceilings(ceilings)

    def ask(self, *msg):
        """A question about the device (its env.json entry, its ceilings), untimed."""
        return self.transport.call(msg, None)

    def run_case(
        self, case: Case, impls: list[Impl], baseline: Impl | None = None
    ) -> Iterator[Measured]:
        """Every impl's row of ``case``, each as soon as it is final: the unsupported and those
        that fail their check at once, the others after the timing rounds, the ``baseline``
        first (the others' speedups pair with its rounds). A baseline not in ``impls`` (its row
        was written before a resume) is timed in the rounds all the same, its row not given."""
        settings = self.spec.settings
        self.case, self.broken = case, None
        runnable = []
        for impl in impls:
            reasons = support_reasons(impl, case, settings)
            if reasons:
                yield failed_row(impl, case, "unsupported", "; ".join(reasons))
            else:
                runnable.append(impl)
        if not runnable:
            return  # nothing is made
        self._prepare()
        silent = None
        if baseline is not None and baseline not in impls:
            silent = None if support_reasons(baseline, case, settings) else baseline
        ready = []
        for impl in [*runnable, *([silent] if silent else [])]:
            answer = self._answer(impl, ("check", case, impl))
            if answer is None:
                ready.append(impl)
            elif impl is not silent:
                yield answer
        if ready in ([], [silent]):
            return
        slices: dict[str, list] = {i.name: [] for i in ready}
        anchor: list[dict] = []
        yield from self._rounds(ready, slices, anchor)
        yield from self._finish(ready, slices, tuple(anchor), baseline, silent)

    def _rounds(self, ready: list[Impl], slices: dict, anchor: list[dict]) -> Iterator[Measured]:
        """The timing rounds: the ready impls and the speed anchor round-robin, the order
        rotated each round; on a CPU the impls take their turns sample by sample within one
        step (``TOGETHER``), the anchor before or after them. An impl whose step fails leaves
        the rounds, its row given now."""
        n = self.spec.settings.timer.rounds
        together = self.case.device_type == "cpu"
        order: list = [TOGETHER, ANCHOR] if together else [*ready, ANCHOR]
        for r in range(n):
            if not ready:
                return
            for who in order[r % len(order) :] + order[: r % len(order)]:
                if who == ANCHOR:
                    try:
                        anchor.append({"round": r, **self._step(("anchor", self.case, r))})
                    except WorkerFailed as exc:  # a crash: the case goes on without it
                        order.remove(ANCHOR)
                        if exc.status == LOST:  # the executor is gone: the next row says why
                            during = f"during the speed anchor of timing round {r + 1}"
                            self.broken = WorkerFailed(LOST, f"{exc.reason} ({during})")
                elif who == TOGETHER:
                    yield from self._together(ready, slices, r)
                else:
                    yield from self._alone(who, ready, slices, r, order)

    def _alone(self, who: Impl, ready: list, slices: dict, r: int, order=None):
        """``who``'s part of round ``r`` in a step of its own; its row if the step failed."""
        answer = self._answer(who, ("time", self.case, who, r), f"timing round {r + 1}")
        if isinstance(answer, Measured):
            if order is not None:
                order.remove(who)
            ready.remove(who)
            yield answer
        else:
            slices[who.name].append(answer)

    def _together(self, ready: list, slices: dict, r: int) -> Iterator[Measured]:
        """The ready impls' parts of round ``r`` taken in turns in one step; where that step
        failed (a crash or a hang), each in a step of its own, which names the impl it was."""
        try:
            answers = None if self.broken else self._step(("together", self.case, tuple(ready), r))
        except WorkerFailed as exc:
            answers = None
            if exc.status == LOST:  # the executor is gone: the next row says why, whole
                self.broken = WorkerFailed(LOST, f"{exc.reason} (during timing round {r + 1})")
        for who in list(ready):
            if answers is None:
                yield from self._alone(who, ready, slices, r)
            elif isinstance(answers.get(who.name), Measured):
                ready.remove(who)
                yield answers[who.name]
            elif who.name in answers:
                slices[who.name].append(answers[who.name])

    def _finish(
        self, ready: list[Impl], slices: dict, anchor: tuple, baseline: Impl | None, silent
    ) -> Iterator[Measured]:
        """Each ready impl's row, the baseline's first; an ok baseline's median per round goes
        with the others' finish steps (their speedups, paired by round: run/measuring/row.py)."""
        base = _medians(slices[silent.name]) if silent in ready else None  # baseline per round
        for impl in sorted(ready, key=lambda i: i is not baseline):
            if impl is silent:
                continue
            given = None if impl is baseline else base
            answer = self._answer(impl, ("finish", self.case, impl, slices[impl.name], given))
            if impl is baseline and answer.row["status"] == "ok":
                base = round_medians(answer.times, answer.rounds)
            yield answer._replace(anchor=anchor)

    def _answer(self, impl: Impl, msg: tuple, during: str | None = None):
        """The server's answer to ``impl``'s step, or the impl's failed row."""
        if self.broken:
            return failed_row(impl, self.case, self.broken.status, self.broken.reason)
        try:
            return self._step(msg)
        except WorkerFailed as exc:
            where = f" (during {during})" if during and exc is not self.broken else ""
            return failed_row(impl, self.case, exc.status, exc.reason + where)

    def _step(self, msg: tuple):
        """One step under the timeout; a fresh server gets the case again first."""
        answer = self.transport.call(msg, self.spec.timeout_s)
        if isinstance(answer, str) and answer == UNPREPARED:
            self._prepare()
            if self.broken:
                raise self.broken
            answer = self.transport.call(msg, self.spec.timeout_s)
        return answer

    def _prepare(self) -> None:
        self.broken = None
        try:
            answer = self.transport.call(("prepare", self.case, self.spec.settings), None)
        except WorkerFailed as exc:
            answer = exc
        if isinstance(answer, (WorkerFailed, PrepareFailed)):
            self.broken = WorkerFailed(answer.status, f"{PREPARING}: {answer.reason}")

    def replace(self, say=print) -> bool:
        """After a LOST step: the transport's replacement started (its GPU asked again), or
        False (a transport that cannot be replaced); ``say`` gets a line on what it waits
        for and how that ended."""
        if not self.transport.replace(say):
            return False
        try:
            entry = self.ask("device", ())
        except WorkerFailed:
            return False
        self.gpu = {k: entry.get(k) for k in GPU_WHERE}
        return True

    def loss_detail(self) -> str:
        """What the transport learns of a loss after saying it, once (Transport.loss_detail)."""
        return self.transport.loss_detail()

    def close(self) -> None:
        self.transport.close()


def who(executor: Worker) -> str:
    """'actor 1 on host-b (node 3fa2c1d0)': the executor, as far as it says."""
    where = executor.where
    actor = f"actor {where['actor']} on " if where.get("actor") is not None else ""
    node = f" (node {str(where['node'])[:8]})" if where.get("node") else ""
    return f"{actor}{executor.host or 'this machine'}{node}"


def _medians(slices: list) -> dict[int, float]:
    """round -> the median of an impl's samples in it, from its slices."""
    return round_medians(
        [t for s in slices for t in s.samples_ms], [s.round for s in slices for _ in s.samples_ms]
    )
