"""One point of a sweep.

Shape letters used throughout attnbench:
    B  batch            Hq  query heads       Hkv  key/value heads (Hq % Hkv == 0)
    Sq query length     Skv key/value length  D    head dim

Canonical layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D).

Causal convention: ``causal_align`` top_left (SDPA's ``is_causal``, the default) lets query i
see keys j <= i; bottom_right (FlashAttention >= 2.1, decoding with a KV cache) lets it see
j <= i + Skv - Sq, so the last query sees every key. ``mask`` (none, padding, window)
combines with it; attnbench/masks.py has the rules.

``model`` and ``phase`` label cases that come from a model preset or a phase (spec.py,
models.py); they change nothing in the computation.

Level ``op`` times the attention alone; ``layer`` times a multi-head self-attention block
around it (attnbench/layer.py): x (B, S, d_model) -> q/k/v projections -> attention -> output
projection, d_model = Hq * D.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnbench.dims import DIMS
from attnbench.dims import label as case_label
from attnbench.errors import UsageError
from attnbench.masks import ALIGNS, MASKS, key_bounds, offset
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
PHASES = ("prefill", "decode", "train")


class CaseError(UsageError):
    """A case (or a sweep spec) that cannot be run, with a message saying how to fix it."""


def canonical_dtype(name: str) -> str:
    name = name.strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        allowed = ", ".join([*DTYPES, *DTYPE_ALIASES])
        raise CaseError(f"unknown dtype {name!r} (allowed: {allowed})")
    return name


def causal_pairs(seq_q: int, seq_kv: int, shift: int = 0) -> int:
    """Number of (query, key) pairs a causal mask leaves unmasked when query i sees keys
    j <= i + shift (shift 0: top-left; Skv - Sq: bottom-right)."""
    # row i sees clamp(i + shift + 1, 0, seq_kv) keys: rows below -shift see none, rows from
    # seq_kv - shift - 1 on see all of them, the rows between a run 1, 2, ...
    first = min(max(-shift, 0), seq_q)  # rows that see no key
    last = min(max(seq_kv - shift - 1, first), seq_q)  # rows [first, last) see i + shift + 1
    ramp = sum_range(first + shift + 1, last + shift + 1)
    return ramp + (seq_q - last) * seq_kv


def sum_range(a: int, b: int) -> int:
    """a + (a + 1) + ... + (b - 1), 0 when b <= a."""
    return (b - a) * (a + b - 1) // 2 if b > a else 0


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
    causal_align: str = "top_left"  # top_left or bottom_right (masks.py): causal and window
    model: str = ""  # the model preset the case comes from (models.py), or blank
    phase: str = ""  # prefill, decode or train when the case comes from a phase, or blank

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
        if self.causal_align not in ALIGNS:
            raise CaseError(
                f"unknown causal_align {self.causal_align!r} (allowed: {', '.join(ALIGNS)})"
            )
        if self.causal_align != "top_left" and not (self.causal or self.mask == "window"):
            raise CaseError(
                f"causal_align={self.causal_align} moves the diagonal of a causal or window "
                f"mask; this case has neither (set causal true or mask window)"
            )
        if self.phase and self.phase not in PHASES:
            raise CaseError(f"unknown phase {self.phase!r} (allowed: {', '.join(PHASES)})")
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
        if self.seq_q + self.shift > self.seq_kv + self.window - 1:
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

    @property
    def shift(self) -> int:
        """Position of query 0 among the keys: 0 top-left, Skv - Sq bottom-right."""
        return offset(self.causal_align, self.seq_q, self.seq_kv)

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
                causal_pairs(self.seq_q, self.seq_kv, self.shift)
                if self.causal
                else self.seq_q * self.seq_kv
            )
            return self.batch * per_batch
        lo, hi = key_bounds(
            torch.arange(self.seq_q),
            self.seq_kv,
            causal=self.causal,
            window=self.window,
            kv_lens=None if kv_lens is None else torch.tensor(kv_lens),
            shift=self.shift,
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

    def bytes_moved(self) -> float:
        """The fewest bytes the timed work can move, each tensor read or written once:
        level op fwd reads q, k, v and writes out; bwd reads q, k, v, out, dout and writes
        dq, dk, dv; fwd_bwd reads q, k, v, dout and writes out, dq, dk, dv. Level layer: the
        same with x, the four weights and the output (B, S, d_model) in their place."""
        elt = torch.finfo(self.torch_dtype).bits // 8
        if self.level == "layer":
            d_kv = self.kv_heads * self.head_dim
            inputs = self.batch * self.seq_q * self.d_model  # x
            inputs += 2 * self.d_model * (self.d_model + d_kv)  # wq, wo; wk, wv
            output = self.batch * self.seq_q * self.d_model
        else:
            q = self.batch * self.heads * self.seq_q * self.head_dim  # also out, dout, dq
            inputs = q + 2 * self.batch * self.kv_heads * self.seq_kv * self.head_dim
            output = q
        elements = {
            "fwd": inputs + output,  # read the inputs, write the output
            "bwd": 2 * inputs + 2 * output,  # read inputs, output, its grad; write grads
            "fwd_bwd": 2 * inputs + 2 * output,  # read inputs, grad; write output, grads
        }[self.mode]
        return float(elements * elt)

    @classmethod
    def from_row(cls, row) -> Case:
        """The case of a results row (a dict or a pandas row; blank cells are missing). A
        column added after the first runs (dims.py) that is missing or blank takes the
        field's default, which is what older rows meant."""
        fields = {}
        for dim in DIMS:
            v = row[dim.name] if dim.name in row else None  # results written before the column
            v = None if v is None or str(v) in ("", "<NA>", "nan", "None") else v
            if v is not None:
                fields[dim.name] = dim.read(v)
            elif not dim.later:
                fields[dim.name] = None
        return cls(**fields)

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        """'B1 H4/2 S128x256 D64 float32 causal fwd' and so on: dims.label."""
        return case_label(self)
