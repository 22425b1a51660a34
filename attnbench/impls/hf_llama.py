"""transformers' attention modules, hosted whole at level layer. ``hf_llama_eager`` and
``hf_llama_sdpa`` build a ``LlamaAttention`` from a tiny ``LlamaConfig`` of the case's sizes
(hidden_size = Hq·D, num_attention_heads = Hq, num_key_value_heads = Hkv, head_dim = D, no
bias, no dropout) with ``attn_implementation`` eager or sdpa, so a row times its own q/k/v
projections, head split, rotary step, attention and output projection, as a Llama decoder
layer runs them. ``hf_attention`` builds the other families of ``FAMILIES`` the same way, each
with its layout (attnbench/module_layout.py): Qwen2 (biases on q, k, v), Qwen3 and Gemma-3 (an
RMSNorm over each head of q and k; Gemma's weight applied as 1 + w), OLMo-2 (an RMSNorm over
the whole q and k projections); a plugin registers them (docs/plugins.md).

Rotary embeddings: the module rotates q and k by the ``position_embeddings`` (cos, sin) it is
handed. It is handed cos = 1, sin = 0 (B, S, D): the rotation's arithmetic runs (and is timed)
but is the identity, so the float64 reference (run/measuring/layer.py, which has no rotary step) is
the exact layer computed. What is not checked: that the module rotates correctly (a rotary bug
would pass); what is not built: the model's rotary table (``LlamaRotaryEmbedding``), computed
once per forward for all layers.

The attention mask comes from transformers' own builders, as for ``hf_eager`` and ``hf_sdpa``
(impls/hf.py ``prepare``), once per row outside the timing; ``is_causal`` is set to the case's.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

from attnbench.case import Case
from attnbench.impls.hf import HF_MASKS, INSTALL, _hf_reasons, _too_old, prepare
from attnbench.module_layout import LayerModule, ModuleLayout, QKNorm
from attnbench.registry import register


class Family(NamedTuple):
    model: str  # transformers.models.<model>.modeling_<model>
    config: str  # its config class
    attention: str  # its attention module class
    layout: ModuleLayout
    head_dim_fields: tuple[str, ...] = ()  # config fields set to head_dim


def qk_norms(**declared) -> ModuleLayout:
    """transformers' layout with its norms on q and k, ``q_norm`` and ``k_norm``."""
    return ModuleLayout(q_norm=QKNorm("q_norm", **declared), k_norm=QKNorm("k_norm", **declared))


FAMILIES = {
    "llama": Family("llama", "LlamaConfig", "LlamaAttention", ModuleLayout()),
    "qwen2": Family("qwen2", "Qwen2Config", "Qwen2Attention", ModuleLayout()),
    "qwen3": Family("qwen3", "Qwen3Config", "Qwen3Attention", qk_norms()),
    "olmo2": Family("olmo2", "Olmo2Config", "Olmo2Attention", qk_norms(scope="projection")),
    "gemma3": Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3Attention",
        qk_norms(unit_offset=True),
        ("query_pre_attn_scalar",),  # its scale is query_pre_attn_scalar**-0.5
    ),
}


def hf_attention(family: str, impl: str, case: Case, mask) -> LayerModule:
    """transformers' attention module of ``family`` (FAMILIES) with ``attn_implementation``
    ``impl``, of the case's sizes, and its call x (B, S, d_model) -> (B, S, d_model)."""
    fam = FAMILIES[family]
    modeling = importlib.import_module(f"transformers.models.{fam.model}.modeling_{fam.model}")
    B, S, D, dtype, device = case.batch, case.seq_q, case.head_dim, case.torch_dtype, case.device
    sizes = dict(
        hidden_size=case.d_model,
        num_attention_heads=case.heads,
        num_key_value_heads=case.kv_heads,
        head_dim=D,
    )
    extra = dict.fromkeys(fam.head_dim_fields, D)
    config = getattr(modeling, fam.config)(**sizes, **extra, attention_dropout=0.0)
    config._attn_implementation = impl
    module = getattr(modeling, fam.attention)(config, layer_idx=0).to(device=device, dtype=dtype)
    module.is_causal = case.causal  # sdpa reads it where the mask builders return None
    rotary = (  # identity rotation: the module's rotary arithmetic runs, q and k unchanged
        torch.ones(B, S, D, dtype=dtype, device=device),
        torch.zeros(B, S, D, dtype=dtype, device=device),
    )
    shape = (B, case.heads, case.kv_heads, S, S)
    built = prepare(impl, shape, case.causal, mask, dtype, device, case.backward)
    attention_mask = built["attention_mask"]
    kwargs = {k: v for k, v in built["kwargs"].items() if k != "dropout"}  # the module passes it
    if hasattr(module, "sliding_window"):  # one that passes its own (Qwen, Gemma): the case's
        module.sliding_window = kwargs.pop("sliding_window")

    def forward(x: torch.Tensor) -> torch.Tensor:  # x (B, S, d_model) -> (B, S, d_model)
        out, _ = module(x, rotary, attention_mask, **kwargs)
        return out

    return LayerModule.of(module, forward, fam.layout)


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
    return hf_attention("llama", "eager", case, mask)


@register(
    "hf_llama_sdpa",
    color="#8ca252",
    description="transformers' LlamaAttention module (sdpa), its projections and identity "
    "rotary; level layer only",
    **COMMON,
)
def hf_llama_sdpa(case: Case, mask) -> LayerModule:
    return hf_attention("llama", "sdpa", case, mask)
