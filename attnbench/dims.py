"""The case dimensions, each declared once: its name (the ``Case`` field and the CSV column),
its type, what rows written before its column hold, its part of the case label, the sweep
options that set it, and the column's meaning. ``Case`` (case.py), the row schema
(store/schema.py: columns, the row's key, old rows), ``Case.from_row``, the Spec options the
sweep passes on (spec.py) and the one case label (``label``) are derived from this table.

The table is in the order of the row's key (store/schema.py CASE_KEY, also the column order
of samples.csv and kernels.csv); ``rank`` orders the label's parts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnbench.masks import KINDS

REQUIRED = object()  # a column every row has had since the first runs
PANDAS_DTYPES = {int: "Int64", bool: "boolean", str: "string"}


@dataclass(frozen=True)
class Dim:
    name: str  # the Case field and the CSV column
    kind: type  # int, bool or str: what a CSV cell is read back as
    meaning: str  # the column's meaning (docs/columns.md)
    options: tuple[str, ...] = ()  # the sweep options (flags, sweep-file keys) that set it
    old: object = REQUIRED  # what rows written before the column hold (None: blank)
    part: Callable | None = None  # its text in the case label, leading separator included
    rank: int = 0  # the part's place in the label
    title: str | None = None  # its prefix in a figure's title ("B=" for B=4); None: "name="
    # the reproducer's sweep flags selecting this dimension's value of a case; None: the first
    # option's flag with the value as text, left out when the value is blank
    repro: Callable | None = None

    @property
    def dtype(self) -> str:
        """The column's pandas dtype."""
        return PANDAS_DTYPES[self.kind]

    def read(self, value):
        """A cell's value as this dimension's type ('False' in a CSV's text is False)."""
        if self.kind is bool and isinstance(value, str):
            return value == "True"
        return self.kind(value)

    @property
    def title_prefix(self) -> str:
        return f"{self.name}=" if self.title is None else self.title

    def flags(self, case) -> list[str]:
        """The sweep flags that select ``case``'s value of this dimension (store/repro.py)."""
        if self.repro is not None:
            return self.repro(case)
        value = getattr(case, self.name)
        if not self.options or value is None or value == "":
            return []
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return ["--" + self.options[0].replace("_", "-"), text]

    @property
    def later(self) -> bool:
        """A key column added after the first runs: older rows lack it."""
        return self.old is not REQUIRED


def _mask_part(c) -> str:
    return KINDS[c.mask].label(c)


def _mask_flags(c) -> list[str]:
    """--mask KIND:SPEC: the kind's spec (the pattern dimension) travels with it."""
    return ["--mask", c.mask if c.pattern is None else f"{c.mask}:{c.pattern}"]


DIMS: tuple[Dim, ...] = (
    Dim(
        "mode",
        str,
        "fwd, bwd (backward alone) or fwd_bwd",
        ("mode",),
        part=lambda c: f" {c.mode}",
        title="",
        rank=12,
    ),
    Dim("batch", int, "B", ("batch",), part=lambda c: f"B{c.batch}", rank=2, title="B="),
    Dim(
        "heads",
        int,
        "Hq, query heads",
        ("heads",),
        part=lambda c: f" H{c.heads}",
        rank=3,
        title="H=",
    ),
    Dim(
        "kv_heads",
        int,
        "Hkv, key/value heads (< heads: GQA/MQA)",
        ("kv_heads",),
        part=lambda c: f"/{c.kv_heads}" if c.kv_heads != c.heads else "",
        rank=4,
        title="Hkv=",
    ),
    Dim(
        "seq_q",
        int,
        "Sq, query length",
        ("seq_len",),
        part=lambda c: f" S{c.seq_q}",
        rank=5,
        title="Sq=",
    ),
    Dim(
        "seq_kv",
        int,
        "Skv, key/value length",
        ("seq_len_kv",),
        part=lambda c: f"x{c.seq_kv}" if c.seq_kv != c.seq_q else "",
        rank=6,
        title="Skv=",
    ),
    Dim("head_dim", int, "D", ("head_dim",), part=lambda c: f" D{c.head_dim}", rank=7, title="D="),
    Dim(
        "dtype",
        str,
        "float32, bfloat16 or float16",
        ("dtype",),
        part=lambda c: f" {c.dtype}",
        rank=8,
        title="",
    ),
    Dim(
        "causal",
        bool,
        "causal mask, aligned as causal_align says",
        ("causal",),
        part=lambda c: " causal" if c.causal else " full",
        rank=9,
        title="causal=",
    ),
    # one device per sweep: --device is the Spec's own field, not a list to sweep
    Dim("device", str, "cpu or cuda", title=""),
    Dim(
        "mask",
        str,
        "the mask kind (attnbench/masks/): none, padding, window, document, block_sparse, "
        "strided, prefix_lm or a plugin's; combines with causal",
        ("mask",),
        part=_mask_part,  # with the window or the pattern, which have no part of their own
        rank=11,
        title="mask=",
        repro=_mask_flags,
    ),
    Dim("window", int, "window width W with mask=window, else blank", ("window",), title="W="),
    Dim(
        "level",
        str,
        "op (attention alone) or layer (projections + attention + output projection)",
        ("level",),
        part=lambda c: " layer" if c.level == "layer" else "",
        rank=13,
        title="level=",
    ),
    Dim(
        "causal_align",
        str,
        "top_left (query i sees keys j <= i, SDPA's is_causal) or bottom_right (j <= i + "
        "seq_kv - seq_q, FlashAttention >= 2.1; decoding); also places a window",
        ("causal_align",),
        old="top_left",
        part=lambda c: " bottom-right" if c.causal_align == "bottom_right" else "",
        rank=10,
        title="",
    ),
    Dim(
        "model",
        str,
        "the model preset the case comes from (--model), else blank",
        ("model",),
        old=None,
        part=lambda c: f"{c.model} " if c.model else "",
        rank=0,
        title="",
    ),
    Dim(
        "phase",
        str,
        "prefill, decode or train when the case comes from --phase, else blank",
        ("phase",),
        old=None,
        # a model without a phase: two spaces after the model (grid.json and draws keys)
        part=lambda c: f"{c.phase} " if c.phase else (" " if c.model else ""),
        rank=1,
        title="",
    ),
    Dim(
        "pattern",
        str,
        "the mask kind's spec, defaults filled in: document the --docs spec (fixed:LEN, "
        "uniform:MIN-MAX or LEN+LEN+...); block_sparse and strided the --sparsity spec; "
        "prefix_lm the prefix (P or PCT%); else blank",
        ("docs", "sparsity"),
        old=None,
        title="",
        repro=lambda c: [],  # --mask KIND:SPEC carries it
    ),
    Dim(
        "score_mod",
        str,
        "the score modifier (attnbench/masks/): softcap:CAP (cap·tanh(s/cap)), alibi (ALiBi "
        "slopes), a plugin's, or blank for none",
        ("score_mod",),
        old=None,
        part=lambda c: f" {c.score_mod}" if c.score_mod else "",
        rank=11.5,
        title="",
    ),
)
DIM = {d.name: d for d in DIMS}
LABEL_PARTS = sorted((d for d in DIMS if d.part), key=lambda d: d.rank)


def label(case, leave_out: tuple[str, ...] = ()) -> str:
    """The case's label, e.g. 'B1 H4/2 S128x256 D64 float32 causal bottom-right window64
    fwd': each dimension's part (store/rundir.py's grid.json and draws file key cases by it,
    so it never changes for a case). ``leave_out`` drops the parts of the dimensions that
    vary within a series or family; ``case`` is anything with the dimensions as attributes."""
    text = "".join(d.part(case) for d in LABEL_PARTS if d.name not in leave_out)
    return " ".join(text.split()) if leave_out else text
