"""CUDA-graph timing (``--cuda-graph``): the timed call captured once into a CUDA graph and
replayed, so that what the host spends launching it (Python, the dispatcher, one launch per
kernel) drops out of the time of short calls, as serving engines replay their decode steps.

``capture(fn)``: a few calls on a side stream first (lazy initialisation, workspaces, autotuning
and compilation must happen before a capture), then one call captured on that stream;
``torch.cuda.graph`` keeps the graph's memory in a private pool, so the replayed kernels write
the same buffers every time. A call that cannot be captured (it synchronises with the host,
reads a tensor on the CPU, or allocates in a way a capture forbids) raises
``GraphCaptureError`` with the reason; its row is then unsupported.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.case import Case
from attnbench.errors import AttnbenchError

WARMUP_CALLS = 3  # on the capture stream, before the capture


class GraphCaptureError(AttnbenchError):
    """The timed call cannot be captured in a CUDA graph."""


def reasons(case: Case) -> list[str]:
    """Why ``case``'s timed call is not captured with --cuda-graph ([] when it is)."""
    if case.backward:
        return [f"mode={case.mode} with --cuda-graph (supported: fwd; a backward is not captured)"]
    return []


def capture(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph; returns a function that replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: another thread's CUDA calls (none of ours: NVML sampling is not CUDA)
        # cannot invalidate this capture
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = fn()
    except Exception as exc:  # noqa: BLE001 - any capture failure is the row's reason
        torch.cuda.synchronize()
        text = " ".join(str(exc).split())[:300]
        raise GraphCaptureError(
            f"the timed call cannot be captured in a CUDA graph ({type(exc).__name__}: {text})"
        ) from exc
    torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()

    replay.output = out  # its memory belongs to the graph's pool: keep it alive with the graph
    return replay
