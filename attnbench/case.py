"""One point of a sweep.

Shape letters used throughout attnbench:
    B  batch            Hq  query heads       Hkv  key/value heads (Hq % Hkv == 0)
    Sq query length     Skv key/value length  D    head dim

Canonical layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D).

Causal convention (SDPA's ``is_causal``): the mask is aligned top-left, query i sees keys
j <= i. With Sq > Skv the last rows see every key; with Sq < Skv the keys j >= Sq are never
seen. Every row sees at least key 0, so no row is empty. ``mask`` (none, padding, window)
combines with it; attnbench/masks.py has the rules.

Level ``op`` times the attention alone; ``layer`` times a multi-head self-attention block
around it (attnbench/layer.py): x (B, S, d_model) -> q/k/v projections -> attention -> output
projection, d_model = Hq * D.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnbench.errors import UsageError
from attnbench.masks import MASKS, key_bounds
from attnbench.patterns import PATTERN_MASKS, canonical

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f32": "float32",
    "half": "float16",
}
MODES = ("fwd", "bwd", "fwd_bwd")
DEVICES = ("cpu", "cuda")
# Backward costs 2.5x the forward's matmul work, forward + backward 3.5x (FlashAttention-2 paper).
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
# A linear layer's backward is two matmuls of the forward's size (grad of input and weight).
PROJ_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.0, "fwd_bwd": 3.0}
LEVELS = ("op", "layer")


class CaseError(UsageError):
    """A case (or a sweep spec) that cannot be run, with a message saying how to fix it."""


def canonical_dtype(name: str) -> str:
    name = name.strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        allowed = ", ".join([*DTYPES, *DTYPE_ALIASES])
        raise CaseError(f"unknown dtype {name!r} (allowed: {allowed})")
    return name


def causal_pairs(seq_q: int, seq_kv: int) -> int:
    """Number of (query, key) pairs a top-left causal mask leaves unmasked."""
    # rows i < seq_kv see i + 1 keys; rows i >= seq_kv see all seq_kv keys
    full = min(seq_q, seq_kv)
    return full * (full + 1) // 2 + (seq_q - full) * seq_kv


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    dtype: str = "float32"
    causal: bool = False
    mode: str = "fwd"
    device: str = "cpu"
    mask: str = "none"  # none, padding, window (masks.py); combines with causal
    window: int | None = None  # window width W, with mask=window only
    level: str = "op"  # op: attention alone; layer: the multi-head block around it
    pattern: str | None = None  # --docs / --sparsity spec of mask document, block_sparse, strided

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        self.validate()

    def validate(self) -> None:
        for name in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CaseError(f"{name}={value!r} must be a positive integer")
        if self.heads % self.kv_heads:
            raise CaseError(
                f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} "
                f"(for GQA/MQA pick kv_heads among the divisors of heads)"
            )
        if self.mode not in MODES:
            raise CaseError(f"unknown mode {self.mode!r} (allowed: {', '.join(MODES)})")
        if self.device.split(":")[0] not in DEVICES:
            raise CaseError(f"unknown device {self.device!r} (allowed: {', '.join(DEVICES)})")
        if self.mask not in MASKS:
            raise CaseError(f"unknown mask {self.mask!r} (allowed: {', '.join(MASKS)})")
        if self.level not in LEVELS:
            raise CaseError(f"unknown level {self.level!r} (allowed: {', '.join(LEVELS)})")
        if self.level == "layer" and self.cross:
            raise CaseError(
                f"level=layer is self-attention: seq_q={self.seq_q} and "
                f"seq_kv={self.seq_kv} must be equal"
            )
        if self.mask in PATTERN_MASKS or self.pattern is not None:
            self._validate_pattern()
            return
        if self.mask != "window":
            if self.window is not None:
                raise CaseError(f"window={self.window} needs mask=window (mask={self.mask})")
            return
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            raise CaseError(
                f"mask=window needs a positive integer window (got {self.window!r}; set --window)"
            )
        if self.seq_q > self.seq_kv + self.window - 1:
            raise CaseError(
                f"mask=window with window={self.window}: queries i >= seq_kv + "
                f"window - 1 = {self.seq_kv + self.window - 1} would see no key "
                f"(seq_q={self.seq_q}); use a wider window or more keys"
            )

    def _validate_pattern(self) -> None:
        """Masks document, block_sparse and strided (patterns.py): self-attention, no window;
        the spec is stored in its canonical form (defaults filled in)."""
        if self.mask not in PATTERN_MASKS:
            raise CaseError(
                f"pattern={self.pattern!r} needs mask {' or '.join(PATTERN_MASKS)} "
                f"(mask={self.mask})"
            )
        if self.window is not None:
            raise CaseError(f"window={self.window} needs mask=window (mask={self.mask})")
        if self.cross:
            raise CaseError(
                f"mask={self.mask} is self-attention: seq_q={self.seq_q} and "
                f"seq_kv={self.seq_kv} must be equal"
            )
        flag = "--docs" if self.mask == "document" else "--sparsity"
        try:
            object.__setattr__(self, "pattern", canonical(self.mask, self.pattern))
        except ValueError as exc:
            raise CaseError(f"mask={self.mask}: {flag} {exc}") from None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def cross(self) -> bool:
        return self.seq_q != self.seq_kv

    @property
    def gqa(self) -> bool:
        return self.heads != self.kv_heads

    @property
    def backward(self) -> bool:
        return self.mode != "fwd"

    def pairs(self, kv_lens: list[int] | None = None, layout=None) -> int:
        """Unmasked (query, key) pairs per head, summed over the batch, exactly. Key padding
        needs the per-batch valid key lengths ``kv_lens`` (inputs.key_lengths); masks
        document, block_sparse and strided their drawn ``layout`` (a patterns.Pattern)."""
        if self.mask in PATTERN_MASKS:
            if layout is None:
                raise ValueError(f"mask={self.mask}: the pair count needs the drawn layout")
            return layout.pairs(self.causal)
        if self.mask == "padding" and kv_lens is None:
            raise ValueError("mask=padding: the pair count needs kv_lens")
        if self.mask == "none":
            per_batch = (
                causal_pairs(self.seq_q, self.seq_kv) if self.causal else self.seq_q * self.seq_kv
            )
            return self.batch * per_batch
        lo, hi = key_bounds(
            torch.arange(self.seq_q),
            self.seq_kv,
            causal=self.causal,
            window=self.window,
            kv_lens=None if kv_lens is None else torch.tensor(kv_lens),
        )
        counts = (hi - lo).clamp(min=0).sum()  # over (Bm, Sq)
        return int(counts) * (1 if kv_lens is not None else self.batch)

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    def projection_flops(self) -> float:
        """Forward FLOPs of the layer's four projections: q and out are d_model x d_model,
        k and v d_model x (Hkv·D), each 2·B·S·d_in·d_out."""
        d_kv = self.kv_heads * self.head_dim
        return 2.0 * self.batch * self.seq_q * self.d_model * (2 * self.d_model + 2 * d_kv)

    def flops(self, kv_lens: list[int] | None = None, layout=None) -> float:
        """Matmul FLOPs of the timed work: 4·Hq·pairs·D for the attention forward (QK^T and
        PV; pairs summed over the batch), times 2.5 for backward alone and 3.5 for forward +
        backward. Level layer adds the projections: forward FLOPs times 1, 2 (input and
        weight grads) or 3."""
        fwd = 4.0 * self.heads * self.pairs(kv_lens, layout) * self.head_dim
        total = fwd * MODE_FLOP_FACTOR[self.mode]
        if self.level == "layer":
            total += self.projection_flops() * PROJ_FLOP_FACTOR[self.mode]
        return total

    @classmethod
    def from_row(cls, row) -> Case:
        """The case of a results row (a dict or a pandas row; blank cells are missing)."""

        def value(name, kind):
            v = row[name] if name in row else None  # results written before the column
            return None if v is None or str(v) in ("", "<NA>", "nan", "None") else kind(v)

        ints = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "window")
        return cls(
            **{
                f: value(f, int if f in ints else bool if f == "causal" else str)
                for f in cls.__dataclass_fields__
            }
        )

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.gqa else ""
        sk = f"x{self.seq_kv}" if self.cross else ""
        mask = {"none": "", "padding": " padding", "window": f" window{self.window}"}.get(
            self.mask, f" {self.mask} {self.pattern}"
        )
        level = " layer" if self.level == "layer" else ""
        return (
            f"B{self.batch} H{self.heads}{kv} S{self.seq_q}{sk} D{self.head_dim} "
            f"{self.dtype} {'causal' if self.causal else 'full'}{mask} {self.mode}{level}"
        )
