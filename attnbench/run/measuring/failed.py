"""A failed row: its status and reason, every metric blank (the rule: a failed case has no
number: ``failed_row``). ``caught`` names what a row's steps raised; ``error_reason`` fits an
error in one line, keeping its full text for the run's errors log."""

from __future__ import annotations

import re
import traceback
from typing import NamedTuple

import torch

from attnbench import errors
from attnbench.case import Case
from attnbench.measure.cuda_graph import GraphCaptureError
from attnbench.registry import Impl, Unsupported
from attnbench.run.measuring.call import BadOutput
from attnbench.store.rundir import RunDir
from attnbench.store.schema import COLUMNS

REASON_CHARS = 500  # a failed row's reason keeps about this much of its error
# a compiler's diagnostic line (gcc, clang, nvcc, ptxas: "file:line:col: error: ..."), which a
# compile error's message buries between the command line and pages of warnings
COMPILER_ERROR = re.compile(r"^.*\berror\b: .*$", re.MULTILINE)
# an error raised in another process (a compile worker) carries that process's traceback in
# its message; its last exception line is the cause ("AssertionError('... int64 and int32')")
EMBEDDED = "Traceback (most recent call last)"
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b[:(].*$", re.M)


class Measured(NamedTuple):
    row: dict
    times: list[float]  # the timing samples, ms
    kernels: list[dict]  # with --profile: the kernel (GPU) or op (CPU) table of the pair
    error: str | None = None  # the full error (traceback) when the reason had to cut it short
    rounds: tuple[int, ...] = ()  # the round of each timing sample
    anchor: tuple[dict, ...] = ()  # the case's speed-anchor rounds (measure/anchor.py)


def base_row(impl: Impl, case: Case) -> dict:
    """The row's identity, every other column blank (its steps fill them for ok rows)."""
    row = {name: None for name in COLUMNS}
    row.update(case.columns(), impl=impl.name)
    return row


def caught(impl: Impl, case: Case, exc: Exception) -> Measured:
    """The failed row for what a row's steps raised: unsupported (the impl or the CUDA-graph
    capture refused), a bad output, out of memory, or an error (its full text kept for the
    run's errors log when the reason cuts it short)."""
    if isinstance(exc, (Unsupported, GraphCaptureError)):
        return failed_row(impl, case, "unsupported", str(exc))
    if isinstance(exc, BadOutput):
        return failed_row(impl, case, "error", f"bad output: {exc}")
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _is_cpu_oom(exc):
        return failed_row(impl, case, "oom", _oom_reason(case, exc))
    reason, full = error_reason(exc)
    return failed_row(impl, case, "error", reason)._replace(error=full)


def case_failure(case: Case, exc: Exception) -> tuple[str, str]:
    """(status, reason) of a case whose inputs or reference raised ``exc``: oom when it ran
    out of memory, else error; one line either way."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or _is_cpu_oom(exc):
        return "oom", _oom_reason(case, exc)
    return "error", errors.one_line(f"{type(exc).__name__}: {exc}")


def failed_row(impl: Impl, case: Case, status: str, reason: str) -> Measured:
    """A failed row: its identity, ``status`` and ``reason``, every metric blank."""
    return Measured({**base_row(impl, case), "status": status, "reason": reason}, [], [])


def _is_cpu_oom(exc: Exception) -> bool:
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _oom_reason(case: Case, exc: BaseException) -> str:
    return (
        f"out of memory at B={case.batch} Hq={case.heads} seq_q={case.seq_q} "
        f"seq_kv={case.seq_kv} D={case.head_dim} {case.dtype}: {one_line(exc)}"
    )


def error_reason(exc: BaseException) -> tuple[str, str | None]:
    """A failed row's reason, one line: the error's type and message, and when that is longer
    than REASON_CHARS its start and its end, or instead of the end a compiler's first error
    line (after its command line, before its warnings), naming the run's errors log; an error
    that carries another process's traceback (a compile worker's) starts with that
    traceback's last exception line. Then also the full error with its traceback, for the
    log."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(text) <= REASON_CHARS:
        return text, None
    half = REASON_CHARS // 2
    full = "".join(traceback.format_exception(exc))
    where = f"the full error is in {RunDir.ERRORS} in the run folder"
    head, embedded, inner = str(exc).partition(EMBEDDED)
    causes = EXCEPTION_LINE.findall(inner) if embedded else []
    if causes:  # the cause first: a terminal line shows only the reason's start
        cause = " ".join(causes[-1].split())[:half]
        raised = f"{type(exc).__name__}: {' '.join(head.split())}"[:half]
        return f"{cause} (raised in another process, reported as {raised}; {where})", full
    diagnostic = COMPILER_ERROR.search(str(exc))  # the compiler's first error, if any
    end = " ".join(diagnostic.group(0).split())[:half] if diagnostic else text[-half:]
    return f"{text[:half]} [...] {end} (cut short: {where})", full


def one_line(exc: BaseException) -> str:
    """A failed row's reason: the exception's text on one line, at most 500 characters."""
    return errors.one_line(exc, 500)
