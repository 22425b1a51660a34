"""One point of a sweep.

Shape letters used throughout attnbench:
    B  batch            Hq  query heads       Hkv  key/value heads (Hq % Hkv == 0)
    Sq query length     Skv key/value length  D    head dim

Canonical layout: q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); out (B, Hq, Sq, D).

Causal convention: ``causal_align`` top_left (SDPA's ``is_causal``, the default) lets query i
see keys j <= i; bottom_right (FlashAttention >= 2.1, decoding with a KV cache) lets it see
j <= i + Skv - Sq, so the last query sees every key. ``mask`` (a kind of attnbench/masks/,
its spec in ``pattern``) combines with it, and ``score_mod`` (softcap, alibi) changes the
scores under any mask; attnbench/masks/ has the rules.

``model`` and ``phase`` label cases that come from a model preset or a phase (spec.py,
models.py); they change nothing in the computation.

Level ``op`` times the attention alone; ``layer`` times a multi-head self-attention block
around it (attnbench/layer.py): x (B, S, d_model) -> q/k/v projections -> attention -> output
projection, d_model = Hq * D.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from attnbench.dims import DIMS
from attnbench.dims import label as case_label
from attnbench.errors import UsageError
from attnbench.masks import ALIGNS, KINDS, canonical_mod, make_mod, offset
from attnbench.masks.interval import causal_pairs, sum_range  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import torch

# dtype name -> an element's bytes. Names, not torch dtypes: the report, compare and fidelity
# read cases without importing torch (2 s); torch_dtype(name) is the torch dtype of a name.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
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
    if name not in DTYPE_BYTES:
        allowed = ", ".join([*DTYPE_BYTES, *DTYPE_ALIASES])
        raise CaseError(f"unknown dtype {name!r} (allowed: {allowed})")
    return name


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name of DTYPE_BYTES ('bfloat16' -> torch.bfloat16)."""
    import torch

    return getattr(torch, name)


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
    mask: str = "none"  # a kind of attnbench/masks/ (masks.KINDS); combines with causal
    level: str = "op"  # op: attention alone; layer: the multi-head block around it
    pattern: str | None = None  # the mask kind's spec (--mask KIND:SPEC, --docs, --sparsity, ...)
    causal_align: str = "top_left"  # top_left or bottom_right (masks/rules.py)
    model: str = ""  # the model preset the case comes from (models.py), or blank
    phase: str = ""  # prefill, decode or train when the case comes from a phase, or blank
    score_mod: str = ""  # a score modifier of attnbench/masks/ (softcap:50, alibi), or blank

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
        if self.mask not in KINDS:
            raise CaseError(f"unknown mask {self.mask!r} (allowed: {', '.join(KINDS)})")
        if self.level not in LEVELS:
            raise CaseError(f"unknown level {self.level!r} (allowed: {', '.join(LEVELS)})")
        if self.causal_align not in ALIGNS:
            raise CaseError(
                f"unknown causal_align {self.causal_align!r} (allowed: {', '.join(ALIGNS)})"
            )
        if self.causal_align != "top_left" and not (self.causal or self.kind.aligned):
            raise CaseError(
                f"causal_align={self.causal_align} moves the diagonal of a causal mask or a "
                f"mask that it places ({', '.join(k.name for k in KINDS.values() if k.aligned)}); "
                f"this case has neither (set causal true)"
            )
        if self.phase and self.phase not in PHASES:
            raise CaseError(f"unknown phase {self.phase!r} (allowed: {', '.join(PHASES)})")
        if self.level == "layer" and self.cross:
            raise CaseError(
                f"level=layer is self-attention: seq_q={self.seq_q} and "
                f"seq_kv={self.seq_kv} must be equal"
            )
        self._validate_mask()

    def _validate_mask(self) -> None:
        """The kind's own checks; its spec and the score modifier stored in canonical form."""
        kind = self.kind
        if self.pattern is not None and not kind.takes_spec:
            takes = [k.name for k in KINDS.values() if k.takes_spec]
            raise CaseError(
                f"pattern={self.pattern!r} needs mask {' or '.join(takes)} (mask={self.mask})"
            )
        try:
            object.__setattr__(self, "pattern", kind.canonical(self.pattern))
        except ValueError as exc:
            raise CaseError(f"mask={self.mask}: {kind.spec_flag} {exc}") from None
        try:
            kind.check(self)
        except ValueError as exc:
            raise CaseError(str(exc)) from None
        try:
            object.__setattr__(self, "score_mod", canonical_mod(self.score_mod))
        except ValueError as exc:
            raise CaseError(f"{exc} (--score-mod)") from None

    @property
    def kind(self):
        """The mask's kind (masks.KINDS)."""
        return KINDS[self.mask]

    def modifier(self):
        """The case's score modifier (a masks.ScoreMod), None without one."""
        return make_mod(self.score_mod, self.heads, self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

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

    def pairs(self, layout=None) -> int:
        """Unmasked (query, key) pairs per head, summed over the batch, exactly: the kind's
        count of the case's drawn ``layout`` (a masks.Layout: ``inputs.mask.layout``; mask
        none needs none)."""
        return self.kind.pairs(self, layout)

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    def projection_flops(self) -> float:
        """Forward FLOPs of the layer's four projections: q and out are d_model x d_model,
        k and v d_model x (Hkv·D), each 2·B·S·d_in·d_out."""
        d_kv = self.kv_heads * self.head_dim
        return 2.0 * self.batch * self.seq_q * self.d_model * (2 * self.d_model + 2 * d_kv)

    def flops(self, layout=None) -> float:
        """Matmul FLOPs of the timed work: 4·Hq·pairs·D for the attention forward (QK^T and
        PV; pairs summed over the batch), times 2.5 for backward alone and 3.5 for forward +
        backward. Level layer adds the projections: forward FLOPs times 1, 2 (input and
        weight grads) or 3."""
        fwd = 4.0 * self.heads * self.pairs(layout) * self.head_dim
        total = fwd * MODE_FLOP_FACTOR[self.mode]
        if self.level == "layer":
            total += self.projection_flops() * PROJ_FLOP_FACTOR[self.mode]
        return total

    def bytes_moved(self) -> float:
        """The fewest bytes the timed work can move, each tensor read or written once:
        level op fwd reads q, k, v and writes out; bwd reads q, k, v, out, dout and writes
        dq, dk, dv; fwd_bwd reads q, k, v, dout and writes out, dq, dk, dv. Level layer: the
        same with x, the four weights and the output (B, S, d_model) in their place."""
        elt = DTYPE_BYTES[self.dtype]
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
                fields[dim.field or dim.name] = dim.read(v)
            elif not dim.later:
                fields.setdefault(dim.field or dim.name, None)
        return cls(**fields)

    def as_dict(self) -> dict:
        """The case's fields (``Case(**case.as_dict())`` is the case)."""
        return asdict(self)

    def columns(self) -> dict:
        """The case's cells in a results row: one per dimension (dims.py)."""
        return {dim.name: dim.value(self) for dim in DIMS}

    def label(self) -> str:
        """'B1 H4/2 S128x256 D64 float32 causal fwd' and so on: dims.label."""
        return case_label(self)
