"""Tile configs of ``triton_flash`` per GPU architecture, autotuning, and launching.

The lists are short on purpose: they were chosen from compiling candidates offline for
sm90 (``compile_report.py``; ``benchmarks/triton_flash_compile_report.md`` holds its output
for every kept config under Triton 3.6 and 3.9, spills included where no candidate was
free of them). They are keyed by the
padded head dim ``HEAD_PAD`` (the power of two the tiles are built for), since register and
shared-memory use grow with it. On sm90 every matmul has M >= 64 (wgmma's tile height).

Under ``TRITON_INTERPRET=1`` (the CPU interpreter) nothing is tuned: ``INTERPRET_TILES`` or
the caller's ``tiles=`` are used, and the persistent forward grid is 3 programs so the
per-program tile loop is exercised.

Variants (``FLAGS``): constexpr flags of the kernels whose defaults are the kernels as tuned
above, so that a variant that wins ships as a config. A config tuple may end with the flags
it sets, as ``(("ONE_LOOP", True), ("WS", True))``; ``launch(..., config=)`` runs one config
as given (the kernel lab does), with no autotuning.

Launch paths (``LAUNCH_PATH``, from ``ATTNBENCH_TRITON_LAUNCH``): ``cached`` (default) runs
the autotuner once per ``launch_key`` and then launches that compiled kernel directly, with
the descriptor scratch kept per (device, stream) and the device's facts read once;
``autotuner`` goes through Triton's autotuner and JIT binder on every call (the path before).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

import torch
import triton

from attnbench.impls.triton_flash.bwd import bwd_kernel
from attnbench.impls.triton_flash.fwd import fwd_kernel

# (BLOCK_M, BLOCK_N) when interpreting or when a caller passes tiles= (no autotune)
INTERPRET_TILES = (32, 16)
INTERPRET_PROGRAMS = 3

# fwd: (BLOCK_M, BLOCK_N, warps, stages, PIPELINE); bwd: (BLOCK_M, BLOCK_N, warps, stages)
CONFIGS = {
    90: {
        "fwd": {
            16: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            32: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            64: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            128: [(128, 64, 8, 2, True), (128, 128, 8, 2, False)],
            256: [(64, 64, 8, 2, False), (128, 32, 8, 2, False)],
        },
        "bwd": {  # 128 and 256: the least spilling found (see the report), no clean one
            16: [(64, 64, 8, 2)],
            32: [(64, 64, 8, 2)],
            64: [(64, 64, 8, 2)],
            128: [(64, 64, 8, 2)],
            256: [(64, 64, 8, 1)],
        },
    },
    80: {
        "fwd": {
            16: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            32: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            64: [(128, 64, 4, 3, False), (64, 64, 4, 3, False)],
            128: [(128, 64, 8, 3, False), (64, 64, 4, 3, False)],
            256: [(64, 64, 8, 2, False), (64, 32, 4, 2, False)],
        },
        "bwd": {
            16: [(64, 64, 4, 2), (32, 64, 4, 2)],
            32: [(64, 64, 4, 2), (32, 64, 4, 2)],
            64: [(64, 64, 4, 2), (32, 64, 4, 2)],
            128: [(64, 64, 8, 2), (32, 64, 4, 2)],
            256: [(32, 64, 8, 1), (32, 32, 4, 1)],
        },
    },
}


# the variant flags of each kernel (constexprs) and their defaults: the kernels as tuned
FLAGS = {
    # one masked key loop; warp-specialized (needs ONE_LOOP and 4 warps to take effect);
    # persistent grid (one program per SM slot walking the tiles) or one program per tile
    "fwd": {"ONE_LOOP": False, "WS": False, "PERSISTENT": True},
    # dQ added by one TMA reduce per tile (tensor descriptor atomic_add), not fp32 atomics
    "bwd": {"DQ_TMA": False},
}


def meta_of(kind: str, cfg: tuple) -> tuple[dict, int, int]:
    """A config tuple -> (constexprs, num_warps, num_stages); the flags it leaves out are
    the defaults. Unknown flags and WS without ONE_LOOP are refused (ValueError)."""
    meta = {"BLOCK_M": cfg[0], "BLOCK_N": cfg[1], **FLAGS[kind]}
    rest = cfg[4:]
    if kind == "fwd":
        meta["PIPELINE"] = bool(rest[0]) if rest else True
        rest = rest[1:]
    for name, value in rest[0] if rest else ():
        if name not in FLAGS[kind]:
            raise ValueError(f"{kind} flag {name!r} unknown (known: {', '.join(FLAGS[kind])})")
        meta[name] = bool(value)
    if meta.get("WS") and not meta["ONE_LOOP"]:
        raise ValueError("WS needs ONE_LOOP: warp specialization of the two-loop forward "
                         "crashes Triton's pass; set ('ONE_LOOP', True) too")  # fmt: skip
    return meta, cfg[2], cfg[3]


# The kernel lab's variants (benchmarks/kernel_lab.py, compile_report.py --lab): whole config
# tuples at head dim 128 (HEAD_PAD 128, the race's), each a question for a lease. "today" is
# the first kept sm90 config; the others change one thing or two.
_ONE, _WS, _FLAT, _TMA = ("ONE_LOOP", True), ("WS", True), ("PERSISTENT", False), ("DQ_TMA", True)
LAB = {
    "fwd": {
        "today": (128, 64, 8, 2, True),
        "today_n128": (128, 128, 8, 2, False),
        "one_loop": (128, 128, 8, 2, False, (_ONE,)),
        "ws": (128, 128, 4, 2, False, (_ONE, _WS)),  # 12 warps: producer + 2 consumers
        "ws_n64": (128, 64, 4, 2, False, (_ONE, _WS)),
        "flat": (128, 64, 8, 2, True, (_FLAT,)),  # one program per tile
        "flat_ws": (128, 128, 4, 2, False, (_ONE, _WS, _FLAT)),
    },
    "bwd": {
        "today": (64, 64, 8, 2),
        "dq_tma": (64, 64, 8, 2, (_TMA,)),
        "n128": (64, 128, 8, 2),  # wgmma m64n128 for the key-side matmuls
        "n128_dq_tma": (64, 128, 8, 2, (_TMA,)),
        "n128_s1_dq_tma": (64, 128, 8, 1, (_TMA,)),
    },
}


def interpreting() -> bool:
    """True when the kernels were built for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(fwd_kernel, triton.runtime.jit.JITFunction)


@functools.cache
def _device_facts(index: int | None) -> tuple[int, int]:
    """(compute capability major, SM count) of a CUDA device; (8, 0) with none. Read once
    per device: a call's device queries showed in its host time."""
    if index is None or not torch.cuda.is_available():
        return 8, 0
    props = torch.cuda.get_device_properties(index)
    return props.major, props.multi_processor_count


def _current_device() -> int | None:
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def arch() -> int:
    """The config family for the current GPU: 90 on Hopper and newer, else 80."""
    return 90 if _device_facts(_current_device())[0] >= 9 else 80


def _triton_config(kind: str, cfg: tuple) -> triton.Config:
    meta, warps, stages = meta_of(kind, cfg)
    return triton.Config(meta, num_warps=warps, num_stages=stages)


def _keep_for_head_pad(kind: str, family: int):
    """Autotune pruning: the configs listed for this HEAD_PAD only."""

    def prune(configs, named_args, **kwargs):
        listed = CONFIGS[family][kind][{**named_args, **kwargs}["HEAD_PAD"]]
        return [c for c in configs if config_tuple(kind, c) in listed]

    return prune


def config_tuple(kind: str, c: triton.Config) -> tuple:
    t = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
    t = t + (c.kwargs["PIPELINE"],) if kind == "fwd" else t
    flags = tuple((k, c.kwargs[k]) for k, v in FLAGS[kind].items() if c.kwargs.get(k, v) != v)
    return t + (flags,) if flags else t


_KERNELS = {"fwd": fwd_kernel, "bwd": bwd_kernel}
_KEY = ["SQ_KEY", "SKV_KEY", "HEAD_DIM", "HEAD_PAD", "CAUSAL", "ALIGN_END", "VARLEN"]

# tuning results kept on disk (Triton's cache) so that a new process does not benchmark
# every config again (triton >= 3.2 has cache_results)
_CACHE = (
    {"cache_results": True}
    if "cache_results" in inspect.signature(triton.autotune).parameters
    else {}
)


@functools.cache
def _tuned(kind: str, family: int):
    union = dict.fromkeys(cfg for per_pad in CONFIGS[family][kind].values() for cfg in per_pad)
    return triton.autotune(
        configs=[_triton_config(kind, c) for c in union],
        key=_KEY,  # + the argument dtypes, which triton adds itself
        prune_configs_by={"early_config_prune": _keep_for_head_pad(kind, family)},
        reset_to_zero=["DQ"] if kind == "bwd" else None,  # dq is accumulated by atomics
        **_CACHE,
    )(_KERNELS[kind])


LAUNCH_PATHS = ("cached", "autotuner")
LAUNCH_PATH = os.environ.get("ATTNBENCH_TRITON_LAUNCH", "cached")

_SCRATCH: dict[tuple, torch.Tensor] = {}  # (device, stream) -> the descriptor scratch


def _alloc(size: int, alignment: int, stream):
    """Global scratch for the descriptors a kernel builds. The cached path keeps one buffer
    per (device, stream), grown when too small: kernels on one stream run one after another,
    so they can share it. The autotuner path allocates per call, as before."""
    if LAUNCH_PATH == "autotuner":
        return torch.empty(size, device="cuda", dtype=torch.int8)
    key = (torch.cuda.current_device(), stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < size:
        buf = _SCRATCH[key] = torch.empty(size, device="cuda", dtype=torch.int8)
    return buf


_ALLOCATOR_SET = threading.local()


def _ensure_allocator() -> None:
    """Descriptors built inside a kernel need a little global scratch memory; Triton asks
    the allocator set with ``triton.set_allocator`` (per thread), so set one when none is."""
    if getattr(_ALLOCATOR_SET, "done", False):
        return
    try:
        from triton.runtime import _allocation

        missing = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # a triton without the private module: set it
        missing = True
    if missing:
        triton.set_allocator(_alloc)
    _ALLOCATOR_SET.done = True


def launch_key(kind: str, args: tuple, consts: dict) -> tuple:
    """What a tuned call's compiled kernel depends on, at least as finely as Triton's own
    specialization: the device, the constexprs, the autotuning key's values, and per
    argument its dtype and 16-byte alignment (tensors) or whether it is 1, a multiple of 16,
    and within int32 (integers). Two calls with one key run the same compiled kernel."""
    named = dict(zip(_KERNELS[kind].arg_names, args))
    facts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            facts.append((str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, int):
            facts.append((a == 1, a % 16 == 0, -(2**31) <= a < 2**31))
        else:
            facts.append(type(a).__name__)
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    tuned = tuple({**named, **consts}.get(k) for k in _KEY)
    return kind, str(device), tuple(sorted(consts.items())), tuned, tuple(facts)


class _Prepared:
    """A compiled kernel and its tuned config, launched with no autotuner and no binder."""

    def __init__(self, kind: str, kernel, config: triton.Config, consts: dict, n_args: int):
        self.kernel = kernel
        self.meta = {**consts, **config.kwargs}
        self.tail = tuple(self.meta[n] for n in _KERNELS[kind].arg_names[n_args:])
        kernel._init_handles()  # loads the module: sets kernel.function
        self.function, self.packed = kernel.function, kernel.packed_metadata

    def __call__(self, grid_fn, args: tuple) -> None:
        from triton import knobs

        grid = grid_fn(self.meta)
        g = (*grid, 1, 1)
        stream = _stream()
        bound = (*args, *self.tail)
        meta = self.kernel.launch_metadata(grid, stream, *bound)  # None without a hook
        self.kernel.run(g[0], g[1], g[2], stream, self.function, self.packed, meta,
                        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook,
                        *bound)  # fmt: skip


def _stream():
    """The current stream of the current device, as Triton's own launch reads it."""
    from triton.runtime import driver

    return driver.active.get_current_stream(driver.active.get_current_device())


_PREPARED: dict[tuple, _Prepared] = {}


def _launch_tuned(kind: str, grid_fn, args: tuple, consts: dict) -> None:
    """The autotuner's call; on the cached path its compiled kernel is kept per
    ``launch_key`` and the next call with that key launches it directly."""
    if LAUNCH_PATH not in LAUNCH_PATHS:
        raise ValueError(f"ATTNBENCH_TRITON_LAUNCH={LAUNCH_PATH!r} (one of {LAUNCH_PATHS})")
    tuned = _tuned(kind, arch())
    if LAUNCH_PATH == "autotuner":
        tuned[grid_fn](*args, **consts)
        return
    key = launch_key(kind, args, consts)
    prepared = _PREPARED.get(key)
    if prepared is not None:
        prepared(grid_fn, args)
        return
    tuned[grid_fn](*args, **consts)
    config = tuned.best_config
    kernel = _KERNELS[kind].warmup(*args, grid=(1,), **consts, **config.all_kwargs())
    _PREPARED[key] = _Prepared(kind, kernel, config, consts, len(args))


def launch(kind: str, grid_fn, args: tuple, consts: dict, tiles=None, config=None) -> None:
    """Run a kernel: autotuned on a GPU, with fixed tiles when interpreting or when given.
    ``tiles``: (BLOCK_M, BLOCK_N) or, for the forward, (BLOCK_M, BLOCK_N, PIPELINE), the
    flags at their defaults. ``config``: one whole config tuple (``meta_of``), as given."""
    if not interpreting():
        _ensure_allocator()
        if tiles is None and config is None:
            _launch_tuned(kind, grid_fn, args, consts)
            return
    if config is not None:
        meta, warps, stages = meta_of(kind, config)
        _KERNELS[kind][grid_fn({**consts, **meta})](
            *args, **consts, **meta, num_warps=warps, num_stages=stages
        )
        return
    tiles = tiles or INTERPRET_TILES
    meta = {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1], **FLAGS[kind]}
    if kind == "fwd":
        meta["PIPELINE"] = bool(tiles[2]) if len(tiles) > 2 else True
    _KERNELS[kind][grid_fn(meta)](*args, **consts, **meta)


def programs(tiles: int, meta: dict) -> int:
    """Forward grid size: every tile when not ``PERSISTENT``, else about one program per SM
    slot, never more than the tiles."""
    if not meta.get("PERSISTENT", True):
        return tiles
    if interpreting() or not torch.cuda.is_available():
        return max(1, min(tiles, INTERPRET_PROGRAMS))
    sms = _device_facts(_current_device())[1]
    per_sm = 2 if meta.get("BLOCK_M", 128) * meta.get("BLOCK_N", 128) <= 64 * 64 else 1
    return max(1, min(tiles, sms * per_sm))


def _interpreter_descriptor_reduce() -> None:
    """Triton's CPU interpreter has no tensor-descriptor reduce (``desc.atomic_add``, which
    ``DQ_TMA`` uses): give it one, an element-wise fp32 atomic add over the descriptor's
    in-bounds elements, as the TMA reduce does on a GPU."""
    from triton.runtime import interpreter as it

    if hasattr(it.InterpreterBuilder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if kind != it._ir.DESCRIPTOR_REDUCE_KIND.ADD:
            raise NotImplementedError(f"interpreted descriptor reduce {kind}")
        ptrs, mask = desc.materialize_pointers(indices)
        op = it._ir.ATOMIC_OP.FADD
        return self.create_atomic_rmw(op, ptrs, value, mask, it._ir.MEM_SEMANTIC.RELAXED, None)

    it.InterpreterBuilder.create_descriptor_reduce = create_descriptor_reduce


if interpreting():
    _interpreter_descriptor_reduce()
