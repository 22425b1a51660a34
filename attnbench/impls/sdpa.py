"""The SDPA family: ``sdpa`` (PyTorch's own backend choice; the backend column says which
ran) and ``sdpa_flash`` / ``sdpa_efficient`` / ``sdpa_cudnn`` / ``sdpa_math`` (one backend
forced with torch.nn.attention.sdpa_kernel). The backends' names in profiler events are
measure/backends.py's tables.

F.scaled_dot_product_attention for a case: masks as attn_mask, a forced backend whose
refusal becomes ``Unsupported`` with PyTorch's reasons, and which backend actually ran.

Masks: causal alone goes through ``is_causal`` (every backend takes it); any other mask is a
boolean ``attn_mask`` (Bm, 1, Sq, Skv) with causal folded in, built once per row (masks.Mask).
PyTorch's flash backend on CUDA takes no attn_mask, so masked rows there run another backend
(auto) or are refused (sdpa_flash), in PyTorch's words.

Bottom-right causal (``causal_align``): ``sdpa``, ``sdpa_flash`` and ``sdpa_efficient`` pass
PyTorch's own ``torch.nn.attention.bias.causal_lower_right``, which picks a kernel by itself
(the backend column says which ran): the flash kernel with its native bottom-right causal
where ``can_use_flash_attention`` allows it, else the efficient kernel's, else the mask made
dense through ``F.scaled_dot_product_attention``. Both checks refuse a backend ``sdpa_kernel``
has disabled, so a forced row runs the backend it names (``sdpa_flash`` runs the decode rows
flash runs for ``sdpa``), or is refused in PyTorch's words. The forced cuDNN and math
backends, which the bias has no path of theirs for, get the dense mask directly (the bias
would warn on every call that flash and efficient are off). A causal mask that hides no key
(bottom-right with one query: a decode step's new token sees its whole cache) is passed as no
mask at all, as decoding code does, so every backend can take it (the float64 reference still
applies the mask, and the row's agreement checks the equivalence).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnbench.errors import one_line
from attnbench.masks import ALIGNS, ANY, Mask
from attnbench.measure.backends import backends_in
from attnbench.measure.profiling import profiled
from attnbench.registry import Unsupported, register

BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
# the backends causal_lower_right has a kernel path of its own for (its bottom-right causal)
LOWER_RIGHT = ("flash", "efficient")
# What PyTorch raises when no enabled backend takes the case (CUDA, CPU wording)
REFUSALS = ("No available kernel", "No viable backend")


def attention(q, k, v, *, causal: bool, scale: float, mask: Mask | None = None, bias: bool = True):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); is_causal is top-left aligned. bias: bottom-right
    # causal through PyTorch's causal_lower_right, else as a dense mask
    Sq, Skv = q.shape[-2], k.shape[-2]
    shift = mask.shift(Sq, Skv) if mask is not None else 0
    if causal and shift >= Skv - 1:  # query 0 already sees every key: the mask hides nothing
        causal = False  # (one new token against its cache), passed as no mask, as decoding does
    shifted = causal and shift != 0
    attn_mask = None
    if mask is not None and mask.score_mod is not None:
        attn_mask, causal = additive(q, k, causal, mask), False
    elif mask is not None and (mask.kind != "none" or (shifted and not bias)):
        attn_mask = mask.keep(Sq, Skv, causal, q.device)  # (Bm, 1, Sq, Skv)
        causal = False
    elif shifted:
        from torch.nn.attention.bias import causal_lower_right  # imports torch.compile's (s)

        attn_mask, causal = causal_lower_right(Sq, Skv), False
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


def additive(q, k, causal: bool, mask: Mask) -> torch.Tensor:
    """An additive score modifier (ALiBi) as a float attn_mask in q's dtype, -inf where the
    mask hides a key: (Bm, Hq, Sq, Skv), made once per row."""
    Hq, Sq, Skv = q.shape[1], q.shape[-2], k.shape[-2]

    def make():
        bias = mask.score_mod.bias(*mask.positions(Hq, Sq, Skv, q.device))
        if mask.masked(causal):
            bias = bias.masked_fill(~mask.keep(Sq, Skv, causal, q.device), float("-inf"))
        return bias.to(q.dtype)

    return mask.cached(("additive", causal, Sq, Skv, str(q.device)), make)


def forced(name: str) -> Callable:
    """An impl running ``attention`` with only SDPA backend ``name`` enabled."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, BACKENDS[name])
    bias = name in LOWER_RIGHT

    def run(q, k, v, *, causal, scale, mask):
        # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D) -> (B, Hq, Sq, D)
        try:
            with sdpa_kernel(backend):
                return attention(q, k, v, causal=causal, scale=scale, mask=mask, bias=bias)
        except RuntimeError as exc:
            if not any(text in str(exc) for text in REFUSALS):
                raise
            why = refusal(
                lambda: attention(q, k, v, causal=causal, scale=scale, mask=mask, bias=bias),
                backend,
            )
        raise Unsupported(f"PyTorch's {name} backend refused: {why}")

    return run


def refusal(run: Callable[[], object], backend) -> str:
    """PyTorch's reasons, one line, for refusing ``run`` with only ``backend`` enabled. They
    come as UserWarnings before the RuntimeError, so the refused call is repeated (off the hot
    path) with every warning recorded."""
    from torch.nn.attention import sdpa_kernel

    error = "no reason given"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):  # same grad mode: backends' limits can differ
                run()
        except RuntimeError as exc:
            error = one_line(exc)
    reasons = [
        one_line(str(w.message).split("(Triggered internally")[0])
        for w in caught
        if issubclass(w.category, UserWarning)
    ]
    return " ".join(dict.fromkeys(r for r in reasons if r)) or error


def detect_backend(run: Callable[[], object], device_type: str) -> str | None:
    """Which SDPA backend ``run`` used: from the aten op names the profiler records (the same
    on CPU and CUDA), else on CUDA from kernel names; several are joined with '+'."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profiled(activities) as prof:
        run()
        if device_type == "cuda":
            torch.cuda.synchronize()
    return backends_in({event.key for event in prof.key_averages()})


# Static capabilities are what PyTorch builds: the efficient and cuDNN backends are CUDA only;
# flash and math also run on the CPU (flash: aten::_scaled_dot_product_flash_attention_for_cpu,
# which takes every dtype, head dim and attn_mask here). Finer limits (flash on CUDA: float16 /
# bfloat16, no attn_mask; head-dim and alignment limits) differ between torch versions and GPUs,
# so PyTorch itself says them at call time, and they become the row's (unsupported) reason.
COLORS = {"flash": "#ffbb78", "efficient": "#98df8a", "cudnn": "#ff9896", "math": "#c5b0d5"}
DEVICES = {
    "flash": ("cpu", "cuda"),
    "efficient": ("cuda",),
    "cudnn": ("cuda",),
    "math": ("cpu", "cuda"),
}


def call_pairs(case, mask) -> int | None:
    """``sdpa``: the score matrix of the call, B·Sq·Skv, when nothing lets the kernel skip
    part of it (no mask, or a boolean attn_mask, which backends apply to every tile); None with
    causal and no other mask (is_causal, or bottom-right's causal_lower_right bias), where
    skipping tiles past the diagonal is the backend's choice."""
    if case.causal and case.mask == "none":
        return None
    return case.batch * case.seq_q * case.seq_kv


def dense_pairs(case, mask) -> int | None:
    """The forced cuDNN and math backends: as ``call_pairs``, but bottom-right causal with
    Sq != Skv reaches them as a dense boolean attn_mask (``attention(bias=False)``), so the
    whole matrix."""
    if case.causal and case.mask == "none" and case.shift == 0:
        return None
    return case.batch * case.seq_q * case.seq_kv


@register(
    "sdpa",
    color="#ff7f0e",
    masks=ANY,
    score_mods=ANY,
    score_mod_needs=("additive",),  # a bias, as a float attn_mask: ALiBi, a plugin's
    causal_align=ALIGNS,
    backend=detect_backend,
    baseline=True,
    work=call_pairs,
    description="F.scaled_dot_product_attention, default backend choice",
)
def sdpa(q, k, v, *, causal, scale, mask):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D)
    return attention(q, k, v, causal=causal, scale=scale, mask=mask)


for _name, _devices in DEVICES.items():
    register(
        f"sdpa_{_name}",
        devices=_devices,
        masks=ANY,
        score_mods=ANY,
        score_mod_needs=("additive",),  # a bias, as a float attn_mask: ALiBi, a plugin's
        causal_align=ALIGNS,
        backend=_name,
        color=COLORS[_name],
        work=call_pairs if _name in LOWER_RIGHT else dense_pairs,
        description=f"F.scaled_dot_product_attention with only the {_name} backend",
    )(forced(_name))
