"""transformers' ``LlamaAttention`` module, hosted whole at level layer: ``hf_llama_eager`` and
``hf_llama_sdpa`` build it from a tiny ``LlamaConfig`` of the case's sizes (hidden_size =
Hq·D, num_attention_heads = Hq, num_key_value_heads = Hkv, head_dim = D, no bias, no
dropout) with ``attn_implementation`` eager or sdpa, so a row times its own q/k/v projections,
head split, rotary step, attention and output projection, as a Llama decoder layer runs them.

Rotary embeddings: the module rotates q and k by the ``position_embeddings`` (cos, sin) it is
handed. It is handed cos = 1, sin = 0 (B, S, D): the rotation's arithmetic runs (and is timed)
but is the identity, so the float64 reference (run/layer.py, which has no rotary step) is the
exact layer computed. What is not checked: that the module rotates correctly (a rotary bug
would pass); what is not built: the model's rotary table (``LlamaRotaryEmbedding``), computed
once per forward for all layers.

The attention mask comes from transformers' own builders, as for ``hf_eager`` and ``hf_sdpa``
(impls/hf.py ``prepare``), once per row outside the timing; ``is_causal`` is set to the case's.
"""

from __future__ import annotations

import torch

from attnbench.case import Case
from attnbench.impls.hf import HF_MASKS, INSTALL, _hf_reasons, _too_old, prepare
from attnbench.registry import register
from attnbench.run.layer_module import LayerModule


def llama_attention(impl: str, case: Case, mask) -> LayerModule:
    """A LlamaAttention of the case's sizes and its call x (B, S, d_model) -> (B, S, d_model)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    B, S, D, dtype, device = case.batch, case.seq_q, case.head_dim, case.torch_dtype, case.device
    config = LlamaConfig(
        hidden_size=case.d_model,
        num_attention_heads=case.heads,
        num_key_value_heads=case.kv_heads,
        head_dim=D,
        attention_bias=False,
        attention_dropout=0.0,
    )
    config._attn_implementation = impl
    module = LlamaAttention(config, layer_idx=0).to(device=device, dtype=dtype)
    module.is_causal = case.causal  # sdpa reads it where the mask builders return None
    rotary = (  # identity rotation: the module's rotary arithmetic runs, q and k unchanged
        torch.ones(B, S, D, dtype=dtype, device=device),
        torch.zeros(B, S, D, dtype=dtype, device=device),
    )
    shape = (B, case.heads, case.kv_heads, S, S)
    built = prepare(impl, shape, case.causal, mask, dtype, device, case.backward)
    attention_mask = built["attention_mask"]
    kwargs = {k: v for k, v in built["kwargs"].items() if k != "dropout"}  # the module passes it

    def forward(x: torch.Tensor) -> torch.Tensor:  # x (B, S, d_model) -> (B, S, d_model)
        out, _ = module(x, rotary, attention_mask, **kwargs)
        return out

    return LayerModule.of(module, forward)


COMMON = dict(
    module=True,
    masks=HF_MASKS,
    check=_hf_reasons,
    requires={"transformers": INSTALL},
    unavailable=_too_old(),
)


@register(
    "hf_llama_eager",
    color="#637939",
    description="transformers' LlamaAttention module (eager), its projections and identity "
    "rotary; level layer only",
    **COMMON,
)
def hf_llama_eager(case: Case, mask) -> LayerModule:
    return llama_attention("eager", case, mask)


@register(
    "hf_llama_sdpa",
    color="#8ca252",
    description="transformers' LlamaAttention module (sdpa), its projections and identity "
    "rotary; level layer only",
    **COMMON,
)
def hf_llama_sdpa(case: Case, mask) -> LayerModule:
    return llama_attention("sdpa", case, mask)
