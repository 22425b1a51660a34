"""xformers.ops.memory_efficient_attention, in its own (B, S, H, D) layout.

Packed documents (mask document): the batch is flattened into one sequence of B * S tokens
and xformers' block-diagonal bias (one block per document, causal within it when causal)
keeps attention inside each document; its kernels visit only the blocks on the diagonal.

Whose kernels ran: xformers' own dispatcher decides, per call, which of its operators takes
the case, or says why none does (each operator's not-supported reasons: the row is then
``unsupported`` with them). Its operators are PyTorch's kernels (``pytorch:flash``,
``pytorch:efficient``) and its own (``xformers:triton_splitk``, its Triton split-K decode
kernel; ``xformers:fa3`` and the like from its C++/CUDA extension): the row's ``backend`` names
those it used (``xformers_kernels.py``) and the report marks PyTorch's as no independent
baseline.

Where xformers was built for another torch (its build record, ``build_mismatch``), the impl is
unavailable, said before any call: its extension does not load, and then xformers' own check
refuses every operator on CUDA inputs, those that need no extension too."""

import functools

from attnbench.case import Case
from attnbench.errors import one_line
from attnbench.impls.xformers_kernels import INSTALL, build_mismatch, dispatched, quiet
from attnbench.masks import ALIGNS
from attnbench.registry import Unsupported, register


def _gqa_backward(case: Case) -> list[str]:
    """xformers' 5-D (B, S, G, H, D) form, which GQA needs, has forward operators only."""
    if case.gqa and case.backward:
        return [
            f"kv_heads={case.kv_heads} < heads={case.heads} with mode={case.mode} (supported: "
            f"GQA forward only; xformers' 5-D GQA form has no backward operator)"
        ]
    return []


def document_bias(pattern, causal: bool, device):
    """xformers' block-diagonal bias over the flattened batch, one block per document."""
    from xformers.ops.fmha.attn_bias import BlockDiagonalCausalMask, BlockDiagonalMask

    lens = [n for row in pattern.doc_lens for n in row]
    kind = BlockDiagonalCausalMask if causal else BlockDiagonalMask
    return kind.from_seqlens(lens, device=device)


@functools.cache
def _ops():
    """xformers.ops, imported once with its extension's 6-line warning kept off the terminal
    (env.json's ``xformers_kernels`` records whether the extension loaded)."""
    with quiet():
        import xformers.ops

    return xformers.ops


@register(
    "xformers",
    color="#2ca02c",
    devices=("cuda",),
    layout="bshd",
    requires={"xformers": INSTALL},
    unavailable=build_mismatch(),
    causal_align=ALIGNS,
    check=_gqa_backward,
    masks=("document",),
    backend=lambda run, device_type: dispatched(run),
    description="xformers.ops.memory_efficient_attention (CUDA only: xformers has no CPU "
    "operator); its dispatcher picks the operator or says why none takes the case; the "
    "backend column names the operators it dispatched to, pytorch:* where they are "
    "PyTorch's own kernels (xformers_kernels.py)",
)
def xformers(q, k, v, *, causal, scale, mask):
    xops = _ops()
    from xformers.ops.fmha.attn_bias import (
        LowerTriangularFromBottomRightMask,
        LowerTriangularMask,
    )

    # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D)
    B, Sq, Hq, D = q.shape
    bias = None
    if causal:  # xformers' two alignments: top-left (SDPA's is_causal) and bottom-right
        bottom_right = mask.shift(Sq, k.shape[1]) != 0
        bias = LowerTriangularFromBottomRightMask() if bottom_right else LowerTriangularMask()
    if mask.pattern is not None:  # packed documents: one sequence of B * S tokens
        bias = mask.cached(
            ("xformers", causal), lambda: document_bias(mask.pattern, causal, q.device)
        )
        q, k, v = (t.reshape(1, B * t.shape[1], *t.shape[2:]) for t in (q, k, v))
    Bx, Sx = q.shape[:2]  # (1, B * S) with documents, else (B, Sq)
    Skv, Hkv = k.shape[1], k.shape[2]
    if Hq != Hkv:  # GQA: xformers' 5-D form (B, S, G, H, D), k/v broadcast without a copy
        group = Hq // Hkv
        q = q.view(Bx, Sx, Hkv, group, D)
        k = k.unsqueeze(3).expand(Bx, Skv, Hkv, group, D)
        v = v.unsqueeze(3).expand(Bx, Skv, Hkv, group, D)
    try:
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)
    except NotImplementedError as exc:  # its dispatcher: no operator takes this case, and why
        raise Unsupported(one_line(exc)) from exc
    return out.reshape(B, Sq, Hq, D)
