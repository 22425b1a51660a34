"""Whose kernels ``xformers`` runs: its own, or PyTorch's.

xformers.ops.memory_efficient_attention dispatches each call to one of its operators. Some are
xformers' own builds (FlashAttention-3 ``fa3F``/``fa3B`` and the split-K kernels, from its
C++/CUDA extension or its Triton code), or the flash-attn package it wraps (``fa2F@<version>``).
Others only call PyTorch's own kernels: their names end in ``-pt`` (``cutlassF-pt`` is
``aten::_efficient_attention_forward``, ``fa2F@<version>-pt`` is PyTorch's flash kernel). When
the C++/CUDA extension does not load (built for another torch or CUDA: xformers 0.0.35, the
newest that installs beside torch 2.11, was built for torch 2.10 and CUDA 12), only the
``-pt`` operators are left, and an ``xformers`` row would measure PyTorch's kernels, the same
ones as ``sdpa_flash`` or ``sdpa_efficient``.

``extension_failure()`` says, in one line, why the extension does not load (env.json's
record; the impl stays available: xformers' dispatcher decides per call, and its own Triton
split-K kernel needs no extension), and xformers' own 6-line ``WARNING[XFORMERS]`` log block is
kept off the terminal (``quiet``).
``xformers_kernels()`` is env.json's record of that; ``dispatched(run)`` names the operators
that one call used, which becomes the row's ``backend``: ``pytorch:flash`` /
``pytorch:efficient`` for PyTorch's kernels (which xformers may pick with its extension
loaded too), ``xformers:<operator>`` for the others (lower case, without the version and the
F/B direction: ``xformers:triton_splitk``, ``xformers:fa3``).

No registration here (importing this module has no side effect on the registry)."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.errors import one_line
from attnbench.measure.backends import PYTORCH_PREFIX

INSTALL = "pip install 'xformers>=0.0.28'"


@contextlib.contextmanager
def quiet():
    """xformers' logger held for the duration: its records (the extension's warning) are kept
    in the list this yields instead of printed."""
    logger, records = logging.getLogger("xformers"), []
    keep = logging.Handler()
    keep.emit = records.append
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(keep)
    try:
        yield records
    finally:
        logger.removeHandler(keep)
        logger.propagate = propagate


@functools.cache
def extension_failure() -> str | None:
    """Why xformers' C++/CUDA extension does not load here, in one line with the fix; None
    where it loads or xformers is not installed. Runs xformers' own check (its ``_cpp_lib``
    module, which loads the extension) on its own: importing the package takes seconds
    (scipy, torch._dynamo), and this runs wherever the impls are registered."""
    spec = importlib.util.find_spec("xformers")
    folders = (spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / "_cpp_lib.py" if folders else None
    if path is None or not path.is_file():
        return None
    probe = importlib.util.spec_from_file_location("attnbench_xformers_probe", path)
    module = importlib.util.module_from_spec(probe)
    try:
        with quiet():
            probe.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a check we cannot run decides nothing
        return None
    failure = getattr(module, "_cpp_library_load_exception", None)
    if failure is None:
        return None
    why = one_line(failure).split(" Please ")[0]  # before its reinstall advice
    why = why.removeprefix("xFormers can't load C++/CUDA extensions. ")
    try:
        version = f" {importlib.metadata.version('xformers')}"
    except importlib.metadata.PackageNotFoundError:  # importable without its metadata
        version = ""
    if torch.version.cuda is None:  # a CPU build of torch: no xformers build would load
        return (
            f"CUDA only: xformers has no CPU operator, and torch {torch.__version__} has no "
            f"CUDA, so xformers{version}'s C++/CUDA extension cannot load here ({why})"
        )
    return (
        f"xformers{version} cannot load its C++/CUDA extension "
        f"({why}), so its calls would run PyTorch's own kernels, not its own (install an "
        f"xformers built for torch {torch.__version__}: {INSTALL})"
    )


def label(op_name: str) -> str:
    """A backend label for an xformers operator name: ``triton_splitKF`` ->
    ``xformers:triton_splitk``, ``cutlassF-pt`` -> ``pytorch:efficient``."""
    if not op_name.endswith("-pt"):
        name = op_name.split("@")[0]
        return "xformers:" + (name[:-1] if name[-1:] in ("F", "B") else name).lower()
    # PyTorch's kernels, called by xformers: cutlass* is PyTorch's efficient backend's
    # kernel, fa2* its flash kernel
    family = {"cutlass": "efficient", "fa2": "flash"}
    return PYTORCH_PREFIX + next(
        (f for prefix, f in family.items() if op_name.startswith(prefix)), op_name
    )


@functools.cache
def xformers_kernels() -> dict:
    """For env.json: whether xformers' C++/CUDA extension loaded (and why not), and which of
    its attention operators are available, split into its own and PyTorch's."""
    with quiet():  # the extension's warning: extension_error below, and the impl's reason
        import xformers
        from xformers import _cpp_lib
        from xformers.ops.common import OPERATORS_REGISTRY

    failure = _cpp_lib._cpp_library_load_exception
    names = sorted(
        {
            op.NAME
            for op in OPERATORS_REGISTRY
            if op.OPERATOR_CATEGORY == "memory_efficient_attention" and _available(op)
        }
    )
    return {
        "version": getattr(xformers, "__version__", None),
        "extension_loaded": failure is None,
        "extension_error": None if failure is None else one_line(failure)[:300],
        "own_ops": [n for n in names if not label(n).startswith(PYTORCH_PREFIX)],
        "pytorch_ops": [n for n in names if label(n).startswith(PYTORCH_PREFIX)],
    }


def _available(op) -> bool:
    try:
        return bool(op.is_available())
    except Exception:  # noqa: BLE001 - an operator that cannot even say is not available
        return False


def dispatched(run: Callable[[], object], fmha=None) -> str | None:
    """Run ``run`` once and name the operators xformers dispatched it to (forward, and
    backward when ``run`` includes one), as backend labels joined with '+'. ``fmha``: the
    module whose dispatchers are watched (xformers.ops.fmha)."""
    if fmha is None:
        from xformers.ops import fmha

    seen: list[str] = []
    with _recording(fmha, "_dispatch_fw", seen), _recording(fmha, "_dispatch_bw", seen):
        run()
    return "+".join(sorted(dict.fromkeys(label(n) for n in seen))) or None


@contextlib.contextmanager
def _recording(module, name: str, seen: list[str]):
    """``module.name`` (a dispatcher) wrapped so that each operator it returns is noted."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        op = original(*args, **kwargs)
        seen.append(op.NAME)
        return op

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)
