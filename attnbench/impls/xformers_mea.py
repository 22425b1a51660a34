"""xformers.ops.memory_efficient_attention, in its own (B, S, H, D) layout.

Packed documents (mask document): the batch is flattened into one sequence of B * S tokens
and xformers' block-diagonal bias (one block per document, causal within it when causal)
keeps attention inside each document; its kernels visit only the blocks on the diagonal.

Whose kernels ran: xformers hands some cases to PyTorch's own kernels; the row's ``backend``
names the operators used (``xformers_kernels.py``) and its reason says when they were
PyTorch's. Where its C++/CUDA extension does not load, xformers has none of its own left: the
impl is unavailable, with the extension's error and the fix as its reason."""

from attnbench.case import Case
from attnbench.errors import one_line
from attnbench.impls.xformers_kernels import INSTALL, dispatched, extension_failure
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


@register(
    "xformers",
    color="#2ca02c",
    devices=("cuda",),
    layout="bshd",
    requires={"xformers": INSTALL},
    unavailable=extension_failure(),
    causal_align=ALIGNS,
    check=_gqa_backward,
    masks=("document",),
    backend=lambda run, device_type: dispatched(run),
    description="xformers.ops.memory_efficient_attention (CUDA only: xformers has no CPU "
    "operator); the backend column names the operators it dispatched to, pytorch:* where "
    "they are PyTorch's own kernels (xformers_kernels.py)",
)
def xformers(q, k, v, *, causal, scale, mask):
    import xformers.ops as xops
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
    except NotImplementedError as exc:  # no xformers operator takes this case
        raise Unsupported(one_line(exc)) from exc
    return out.reshape(B, Sq, Hq, D)
