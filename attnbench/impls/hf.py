"""transformers' own attention functions, called the way a transformers model calls them:
``hf_eager``, ``hf_sdpa``, ``hf_flex``, ``hf_flash2`` are what a model runs with
``attn_implementation`` set to ``eager``, ``sdpa``, ``flex_attention`` or
``flash_attention_2`` (models.ATTN_IMPLEMENTATIONS), so a row says what that choice costs.

The mask comes from transformers' own builders (masking_utils), once per row and outside the
timing, as a model builds it once per forward for all its layers:

- causal: ``create_causal_mask`` (Llama), with a window ``create_sliding_window_causal_mask``
  (Mistral: config.sliding_window = W keeps p - W < j <= p, attnbench's causal window W);
- not causal: ``create_bidirectional_mask`` (encoders, cross-attention), with a window
  ``create_bidirectional_sliding_window_mask``, which keeps |p - j| <= sliding_window, so
  attnbench's window W (|p - j| < W) is sliding_window = W - 1 there. flash_attention_2 takes
  the window as window_size (sliding_window - 1, sliding_window - 1) instead, so it gets W.
- a case with seq_q != seq_kv is a step against a KV cache holding Skv - Sq earlier tokens
  (decoding, bottom-right aligned: a model's new tokens follow its cache); a stand-in reports
  the sizes a full-attention cache reports (``_CacheSizes``). A top-left causal diagonal
  across unequal lengths has no transformers equivalent (its SDPA path then attends a single
  query to every key), so those cases are ``unsupported``;
- key padding: the 2-D ``attention_mask`` (B, Skv), True for a real token;
- packed documents (causal only): ``position_ids`` restarting at 0 in every document, from
  which transformers finds the documents (its padding-free path); flash_attention_2 needs
  them flattened into one row, (1, B * S), as transformers' flattening collator makes them.

The call is the function a model's attention layer looks up (``ALL_ATTENTION_FUNCTIONS``; eager:
Llama's ``eager_attention_forward``, the default of ``get_interface``) with the arguments a
layer passes. q, k, v arrive (B, S, H, D) as the projections make them and are handed over as
(B, H, S, D) views, as a model's ``view(...).transpose(1, 2)`` does; the output comes back
(B, S, H, D), ready for the output projection.
"""

from __future__ import annotations

import importlib.metadata

import torch

from attnbench.case import Case
from attnbench.impls.flash_attn import FA2_INSTALL
from attnbench.impls.sdpa import detect_backend
from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.registry import register

MIN_VERSION = (5, 9)  # the mask builders read query offsets and mask sizes from the cache
INSTALL = "pip install 'transformers>=5.9'"
HF_MASKS = ("padding", "window", "document")


def _too_old() -> str | None:
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None  # requires= says it is missing
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts >= MIN_VERSION:
        return None
    need = ".".join(map(str, MIN_VERSION))
    return f"transformers {version} is older than {need} (install: {INSTALL})"


class _CacheSizes:
    """What transformers' mask builders read from a full-attention KV cache (a DynamicLayer):
    ``past`` earlier tokens, masks over ``kv_length`` keys."""

    is_compileable = False

    def __init__(self, past: int, kv_length: int):
        self.past, self.kv_length = past, kv_length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.past

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_length, 0


class _Layer(torch.nn.Module):
    """What an attention function reads from the attention layer that calls it."""

    def __init__(self, config, groups: int, causal: bool, training: bool):
        super().__init__()
        self.config, self.num_key_value_groups, self.is_causal = config, groups, causal
        self.layer_idx = 0
        self.train(training)


def _window(impl: str, causal: bool, window: int) -> int:
    """attnbench's window W as transformers' sliding_window for this attention function."""
    return window if causal or impl == "flash_attention_2" else window - 1


def _position_ids(pattern, device) -> torch.Tensor:
    """Each token's position within its document: (B, S) int64, restarting at 0."""
    starts, _ = pattern.doc_bounds()  # (B, S)
    return (torch.arange(pattern.seq_len) - starts).to(device)


def prepare(impl: str, case_shape, causal: bool, mask, dtype, device, training: bool) -> dict:
    """The layer, attention mask and keyword arguments a model hands its attention function,
    built by transformers' mask builders. ``case_shape``: (B, Hq, Hkv, Sq, Skv)."""
    from transformers import PretrainedConfig
    from transformers import masking_utils as mu

    B, Hq, Hkv, Sq, Skv = case_shape
    config = PretrainedConfig()
    config._attn_implementation = impl
    sliding = None if mask.kind != "window" else _window(impl, causal, mask.window)
    config.sliding_window = sliding
    embeds = torch.empty(B, Sq, 0, dtype=dtype, device=device)  # only its shape is read
    padding = None
    if mask.kv_lens is not None:  # (B, Skv), True for a real token
        padding = torch.arange(Skv, device=device)[None, :] < mask.kv_lens.to(device)[:, None]
    kwargs = {"dropout": 0.0, "sliding_window": sliding}
    cache = None  # a decoding step: Skv - Sq earlier tokens (_hf_reasons: never negative)
    if Sq != Skv and (causal or sliding is not None):
        cache = _CacheSizes(Skv - Sq, Skv)
    if causal:
        windowed = sliding is not None
        build = mu.create_sliding_window_causal_mask if windowed else mu.create_causal_mask
        position_ids = None
        if mask.pattern is not None:
            position_ids = _position_ids(mask.pattern, device)  # (B, S)
            if impl == "flash_attention_2":  # transformers' flash path packs one row only
                position_ids = position_ids.reshape(1, B * Sq)
                embeds = torch.empty(1, B * Sq, 0, dtype=dtype, device=device)
            kwargs["position_ids"] = position_ids
        attention_mask = build(config, embeds, padding, cache, position_ids=position_ids)
    else:
        build = (
            mu.create_bidirectional_sliding_window_mask
            if sliding is not None
            else mu.create_bidirectional_mask
        )
        if sliding is not None:
            attention_mask = build(config, embeds, padding, past_key_values=cache)
        else:  # an encoder, or cross-attention to the encoder's Skv states
            states = torch.empty(B, Skv, 0, dtype=dtype, device=device)  # only its shape
            attention_mask = build(config, embeds, padding, encoder_hidden_states=states)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    layer = _Layer(config, Hq // Hkv, causal, training)
    # what a Llama attention layer looks its function up in, on every call
    lookup = (ALL_ATTENTION_FUNCTIONS, eager_attention_forward)
    return {"layer": layer, "attention_mask": attention_mask, "kwargs": kwargs, "lookup": lookup}


def run(impl: str, q, k, v, *, causal: bool, scale: float, mask):
    # q (B, Sq, Hq, D); k, v (B, Skv, Hkv, D) -> (B, Sq, Hq, D)
    B, Sq, Hq, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    training = torch.is_grad_enabled() and q.requires_grad
    call = mask.cached(
        ("hf", impl, causal, B, Sq, Skv, str(q.device), training),
        lambda: prepare(impl, (B, Hq, Hkv, Sq, Skv), causal, mask, q.dtype, q.device, training),
    )
    if impl == "flash_attention_2" and "position_ids" in call["kwargs"]:
        q, k, v = (t.reshape(1, B * Sq, *t.shape[2:]) for t in (q, k, v))  # views
    functions, eager = call["lookup"]
    out, _ = functions.get_interface(impl, eager)(
        call["layer"],
        q.transpose(1, 2),  # (B, Hq, Sq, D) views, as a model's attention layer passes them
        k.transpose(1, 2),
        v.transpose(1, 2),
        call["attention_mask"],
        scaling=scale,
        **call["kwargs"],
    )
    return out.reshape(B, Sq, Hq, D)


def _hf_reasons(case: Case) -> list[str]:
    """What transformers' mask builders cannot express."""
    out = []
    aligned = case.causal or case.mask == "window"
    if aligned and case.causal_align == "bottom_right" and case.seq_q > case.seq_kv:
        out.append(
            f"seq_q={case.seq_q} > seq_kv={case.seq_kv} with causal_align=bottom_right "
            f"(supported: seq_q <= seq_kv; a transformers KV cache holds the new tokens too)"
        )
    if case.mask == "document" and not case.causal:
        out.append(
            "mask=document with causal=False (supported: causal; transformers finds packed "
            "documents from position_ids in its causal mask builders only)"
        )
    return out


def _flash2_reasons(case: Case) -> list[str]:
    out = _hf_reasons(case)
    if case.head_dim > 256:
        out.append(f"head_dim={case.head_dim} (supported: up to 256)")
    return out


def dense_pairs(case: Case, mask) -> int:
    """The whole (Sq, Skv) score matrix of every batch row (eager materialises it)."""
    return case.batch * case.seq_q * case.seq_kv


COMMON = dict(
    layout="bshd",
    masks=HF_MASKS,
    causal_align=("bottom_right",),  # a model's new tokens follow its cache
    requires={"transformers": INSTALL},
    unavailable=_too_old(),
)


@register(
    "hf_eager",
    color="#393b79",
    check=_hf_reasons,
    work=dense_pairs,
    description="transformers' eager attention (attn_implementation='eager'), its float mask",
    **COMMON,
)
def hf_eager(q, k, v, *, causal, scale, mask):
    return run(ATTN_IMPLEMENTATIONS["hf_eager"], q, k, v, causal=causal, scale=scale, mask=mask)


@register(
    "hf_sdpa",
    color="#5254a3",
    check=_hf_reasons,
    backend=detect_backend,  # the SDPA kernel it ran: one contestant with sdpa's rows of it
    description="transformers' SDPA attention (attn_implementation='sdpa'), its mask or is_causal",
    **COMMON,
)
def hf_sdpa(q, k, v, *, causal, scale, mask):
    return run(ATTN_IMPLEMENTATIONS["hf_sdpa"], q, k, v, causal=causal, scale=scale, mask=mask)


@register(
    "hf_flex",
    color="#6b6ecf",
    check=_hf_reasons,
    backward=("cuda",),  # FlexAttention has no backward on the CPU
    compiled=True,
    description="transformers' flex attention (attn_implementation='flex_attention'), "
    "its block mask",
    **COMMON,
)
def hf_flex(q, k, v, *, causal, scale, mask):
    return run(ATTN_IMPLEMENTATIONS["hf_flex"], q, k, v, causal=causal, scale=scale, mask=mask)


@register(
    "hf_flash2",
    color="#9c9ede",
    devices=("cuda",),
    dtypes=("bfloat16", "float16"),
    sm=(80, None),
    check=_flash2_reasons,
    description="transformers' FlashAttention-2 path (attn_implementation='flash_attention_2')",
    **{
        **COMMON,
        # no padding: transformers' flash path drops padded queries (their output is zero),
        # which attnbench's padding case computes
        "masks": ("window", "document"),
        "requires": {
            "transformers": INSTALL,
            "flash_attn": FA2_INSTALL,
        },
    },
)
def hf_flash2(q, k, v, *, causal, scale, mask):
    return run(ATTN_IMPLEMENTATIONS["hf_flash2"], q, k, v, causal=causal, scale=scale, mask=mask)
