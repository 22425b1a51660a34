"""Backend labels: which attention backend ran, named from profiler event names (the SDPA
backends) and the note a row gets when an impl ran PyTorch's own kernels. Impls (impls/sdpa.py,
impls/xformers_kernels.py) and the report's fidelity check read the same tables; importing
this module registers nothing."""

from __future__ import annotations

PYTORCH_PREFIX = "pytorch:"  # a backend label for work handed to PyTorch's own kernels
# aten op name (recorded on CPU and CUDA alike) -> SDPA backend; first match wins
OP_BACKENDS = (
    ("cudnn", "cudnn"),
    ("flash", "flash"),
    ("efficient", "efficient"),
    ("math", "math"),
    ("overrideable", "overrideable"),
)
OP_PREFIX = "aten::_scaled_dot_product_"
# CUDA kernel name -> backend, when no aten op says (no 'cutlass': GEMM kernels have it too)
KERNEL_BACKENDS = (
    ("cudnn", "cudnn"),
    ("flash", "flash"),
    ("fmha", "efficient"),
    ("efficient", "efficient"),
)


def backends_in(names) -> str | None:
    """The SDPA backends that profiler event names show: the aten ops' names where there are
    any, else CUDA kernel names; several are joined with '+', none is None."""
    names = set(names)
    found = match([n for n in names if n.startswith(OP_PREFIX)], OP_BACKENDS)
    if not found:
        found = match([n.lower() for n in names if not n.startswith("aten::")], KERNEL_BACKENDS)
    return "+".join(sorted(found)) or None


def match(names: list[str], table) -> set[str]:
    """The backends of ``table`` ((text, backend) pairs, first match wins) that ``names``
    show."""
    found = set()
    for name in names:
        hit = next((backend for text, backend in table if text in name), None)
        if hit:
            found.add(hit)
    return found


def borrowed_note(impl: str, backend: str | None) -> str | None:
    """The row note when ``impl`` ran PyTorch's own kernels (its backend says so)."""
    if not backend or not backend.startswith(PYTORCH_PREFIX):
        return None
    kernels = "+".join(b.removeprefix(PYTORCH_PREFIX) for b in backend.split("+"))
    return (
        f"{impl} ran PyTorch's own {kernels} kernels (backend {backend}), not kernels of its "
        f"own: this row measures PyTorch, not an independent {impl}; env.json "
        f"xformers_kernels says which operators were available and why"
    )
