"""xformers.ops.memory_efficient_attention, in its own (B, S, H, D) layout."""

from attnbench.case import Case
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


@register(
    "xformers",
    color="#2ca02c",
    devices=("cuda",),
    layout="bshd",
    requires={"xformers": "pip install 'attnbench[xformers]'"},
    causal_align=ALIGNS,
    check=_gqa_backward,
    description="xformers.ops.memory_efficient_attention (CUDA only: xformers has no CPU operator)",
)
def xformers(q, k, v, *, causal, scale, mask):
    import xformers.ops as xops
    from xformers.ops.fmha.attn_bias import (
        LowerTriangularFromBottomRightMask,
        LowerTriangularMask,
    )

    # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D)
    B, Sq, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    if Hq != Hkv:  # GQA: xformers' 5-D form (B, S, G, H, D), k/v broadcast without a copy
        group = Hq // Hkv
        q = q.view(B, Sq, Hkv, group, D)
        k = k.unsqueeze(3).expand(B, Skv, Hkv, group, D)
        v = v.unsqueeze(3).expand(B, Skv, Hkv, group, D)
    bias = None
    if causal:  # xformers' two alignments: top-left (SDPA's is_causal) and bottom-right
        bottom_right = mask.shift(Sq, Skv) != 0
        bias = LowerTriangularFromBottomRightMask() if bottom_right else LowerTriangularMask()
    try:
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)
    except NotImplementedError as exc:  # no xformers operator takes this case
        raise Unsupported(" ".join(str(exc).split())) from exc
    return out.reshape(B, Sq, Hq, D)
