"""Model presets: the attention shapes of published models, one entry per model with its source.

``--model NAME`` sets heads, kv_heads, head_dim, causal, the mask (and window) and the
sequence lengths of a sweep from an entry here; ``--phase`` then says what is run with them
(spec.py). Explicit flags still win over both. Only what the attention op sees is kept:
d_model (the model's hidden size) is listed for the reader; level layer uses
heads x head_dim, which equals it for every model here but Gemma-2.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.case import CaseError
from attnbench.errors import did_you_mean

# transformers' attn_implementation values (what a model user sets), by the attnbench impl that
# runs that attention function the way a model calls it (impls/hf.py)
ATTN_IMPLEMENTATIONS = {
    "hf_eager": "eager",
    "hf_sdpa": "sdpa",
    "hf_flex": "flex_attention",
    "hf_flash2": "flash_attention_2",
}


@dataclass(frozen=True)
class Model:
    name: str
    title: str
    heads: int
    kv_heads: int
    head_dim: int
    d_model: int
    causal: bool
    lengths: tuple[int, ...]  # prefill and train query lengths (self-attention: = key lengths)
    context: int  # the longest context: decode caches go up to it
    source: str  # where the numbers come from (the model's published config)
    masks: tuple[str, ...] = ("none",)  # the mask of each kind of layer (--mask KIND[:SPEC])
    seq_kv: int | None = None  # cross-attention: the fixed key length (encoder frames)
    decoder: bool = True  # has a decode phase (an encoder alone does not)
    score_mod: str = ""  # its score modifier (attnbench/masks/), e.g. softcap:50
    note: str = ""

    @property
    def attention(self) -> str:
        """The attention's kind in words, for --list-models and the report."""
        words = {"none": "full", "padding": "key padding"}
        kind = " + ".join(words.get(m, m.replace(":", " ")) for m in self.masks)
        if self.score_mod:
            kind += f", {self.score_mod}"
        if self.seq_kv:
            kind = f"cross over {self.seq_kv} keys, {kind}"
        return f"{'causal' if self.causal else 'bidirectional'}, {kind}"


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model(
            "gpt2",
            "GPT-2 small",
            heads=12,
            kv_heads=12,
            head_dim=64,
            d_model=768,
            causal=True,
            lengths=(256, 512, 1024),
            context=1024,
            source="huggingface.co/openai-community/gpt2 config.json: n_head 12, n_embd 768, "
            "n_positions 1024",
        ),
        Model(
            "bert-base",
            "BERT-base",
            heads=12,
            kv_heads=12,
            head_dim=64,
            d_model=768,
            causal=False,
            lengths=(128, 512),
            context=512,
            masks=("padding",),
            decoder=False,
            source="huggingface.co/google-bert/bert-base-uncased config.json: "
            "num_attention_heads 12, hidden_size 768, max_position_embeddings 512",
            note="Padded batches: per-sequence valid lengths drawn from the seed",
        ),
        Model(
            "vit-b16",
            "ViT-B/16 at 224 px",
            heads=12,
            kv_heads=12,
            head_dim=64,
            d_model=768,
            causal=False,
            lengths=(197,),
            context=197,
            decoder=False,
            source="Dosovitskiy et al. 2021, Table 1 (ViT-Base: 12 heads, hidden 768); "
            "(224 / 16)^2 = 196 patches + 1 class token = 197 tokens",
        ),
        Model(
            "llama3-8b",
            "Llama-3-8B",
            heads=32,
            kv_heads=8,
            head_dim=128,
            d_model=4096,
            causal=True,
            lengths=(2048, 4096, 8192),
            context=131072,
            source="huggingface.co/meta-llama/Meta-Llama-3-8B config.json: "
            "num_attention_heads 32, num_key_value_heads 8, hidden_size 4096",
            note="Context 8192 (Llama 3) or 131072 (Llama 3.1, same attention shapes): "
            "decode caches go up to the latter",
        ),
        Model(
            "llama3-70b",
            "Llama-3-70B",
            heads=64,
            kv_heads=8,
            head_dim=128,
            d_model=8192,
            causal=True,
            lengths=(2048, 4096, 8192),
            context=131072,
            source="huggingface.co/meta-llama/Meta-Llama-3-70B config.json: "
            "num_attention_heads 64, num_key_value_heads 8, hidden_size 8192",
            note="Context 8192 (Llama 3) or 131072 (Llama 3.1, same attention shapes)",
        ),
        Model(
            "mistral-7b",
            "Mistral-7B-v0.1",
            heads=32,
            kv_heads=8,
            head_dim=128,
            d_model=4096,
            causal=True,
            lengths=(2048, 8192, 16384),
            context=32768,
            masks=("window:4096",),
            source="huggingface.co/mistralai/Mistral-7B-v0.1 config.json: "
            "num_attention_heads 32, num_key_value_heads 8, hidden_size 4096, "
            "sliding_window 4096, max_position_embeddings 32768",
        ),
        Model(
            "gemma2-9b",
            "Gemma-2-9B",
            heads=16,
            kv_heads=8,
            head_dim=256,
            d_model=3584,
            causal=True,
            lengths=(2048, 8192),
            context=8192,
            masks=("window:4096", "none"),
            score_mod="softcap:50",
            source="huggingface.co/google/gemma-2-9b config.json: num_attention_heads 16, "
            "num_key_value_heads 8, head_dim 256, sliding_window 4096, "
            "max_position_embeddings 8192, attn_logit_softcapping 50.0; local and global "
            "layers alternate",
            note="hidden_size 3584 differs from heads x head_dim = 4096, which level layer uses",
        ),
        Model(
            "whisper-small",
            "Whisper small (decoder cross-attention)",
            heads=12,
            kv_heads=12,
            head_dim=64,
            d_model=768,
            causal=False,
            lengths=(448,),
            context=448,
            seq_kv=1500,
            source="huggingface.co/openai/whisper-small config.json: d_model 768, "
            "decoder_attention_heads 12, max_source_positions 1500, max_target_positions 448",
            note="The decoder's queries attend to the 1500 encoder frames of 30 s of audio",
        ),
    )
}


def model(name: str) -> Model:
    """The model preset ``name``; CaseError naming the closest one for a typo."""
    if name in MODELS:
        return MODELS[name]
    did = did_you_mean(name, MODELS, cutoff=0.4)
    raise CaseError(
        f"unknown model {name!r}{did} (allowed: {', '.join(MODELS)}; --list-models shows them)"
    )


def models_table() -> str:
    """--list-models: the table, then each model's source."""
    rows = [
        {
            "model": m.name,
            "heads": m.heads,
            "kv_heads": m.kv_heads,
            "head_dim": m.head_dim,
            "d_model": m.d_model,
            "lengths": ",".join(map(str, m.lengths)),
            "context": m.context,
            "attention": m.attention + ("" if m.decoder else " (encoder: no decode)"),
        }
        for m in MODELS.values()
    ]
    sources = [
        f"{m.name}: {m.title}. {m.source}." + (f" {m.note}." if m.note else "")
        for m in MODELS.values()
    ]
    return "\n".join([pd.DataFrame(rows).to_string(index=False), "", *sources])
