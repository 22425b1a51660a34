"""One point of a sweep.

Shape letters used throughout attnbench:
    B  batch            Hq  query heads       Hkv  key/value heads (Hq % Hkv == 0)
    Sq query length     Skv key/value length  D    head dim

Canonical layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D).

Causal convention (SDPA's ``is_causal``): the mask is aligned top-left, query i sees keys
j <= i. With Sq > Skv the last rows see every key; with Sq < Skv the keys j >= Sq are never
seen. Every row sees at least key 0, so no row is empty.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "f32": "float32", "half": "float16"}
MODES = ("fwd", "bwd", "fwd_bwd")
DEVICES = ("cpu", "cuda")
# Backward costs 2.5x the forward's matmul work, forward + backward 3.5x (FlashAttention-2 paper).
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


class CaseError(ValueError):
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        self.validate()

    def validate(self) -> None:
        for name in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CaseError(f"{name}={value!r} must be a positive integer")
        if self.heads % self.kv_heads:
            raise CaseError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} "
                            f"(for GQA/MQA pick kv_heads among the divisors of heads)")
        if self.mode not in MODES:
            raise CaseError(f"unknown mode {self.mode!r} (allowed: {', '.join(MODES)})")
        if self.device.split(":")[0] not in DEVICES:
            raise CaseError(f"unknown device {self.device!r} (allowed: {', '.join(DEVICES)})")

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

    def pairs(self) -> int:
        """Unmasked (query, key) pairs per (batch, head)."""
        return causal_pairs(self.seq_q, self.seq_kv) if self.causal else self.seq_q * self.seq_kv

    def flops(self) -> float:
        """Matmul FLOPs of the timed work: 4·B·Hq·pairs·D for the forward (QK^T and PV),
        times 2.5 for backward alone and 3.5 for forward + backward."""
        fwd = 4.0 * self.batch * self.heads * self.pairs() * self.head_dim
        return fwd * MODE_FLOP_FACTOR[self.mode]

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.gqa else ""
        sk = f"x{self.seq_kv}" if self.cross else ""
        return (f"B{self.batch} H{self.heads}{kv} S{self.seq_q}{sk} D{self.head_dim} "
                f"{self.dtype} {'causal' if self.causal else 'full'} {self.mode}")
