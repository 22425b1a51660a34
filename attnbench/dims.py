"""The case dimensions, each declared once: its name (the ``Case`` field and the CSV column),
its type, what rows written before its column hold, its part of the case label, the sweep
options that set it, and the column's meaning. ``Case`` (case.py), the row schema
(store/schema.py: columns, the row's key, old rows), ``Case.from_row``, the Spec options the
sweep passes on (spec.py) and the one case label (``label``) are derived from this table.

The table is in the order of the row's key (store/schema.py CASE_KEY, also the column order
of samples.csv and kernels.csv); ``rank`` orders the label's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnbench.masks import KINDS

REQUIRED = object()  # a column every row has had since the first runs
PANDAS_DTYPES = {int: "Int64", bool: "boolean", str: "string"}


@dataclass(frozen=True)
class Part:
    """A dimension's text in a figure's legend (a series) or in a case family's name:
    ``text(row)`` with ``row`` the series' or case's columns ('' says nothing), its place
    among the parts (``rank``), and whether it is said always or only where it varies
    between the series of one table (the rows of one frame, for families)."""

    rank: float
    text: Callable[[Mapping], str]
    always: bool = True


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
    legend: Part | None = None  # its part of a series' legend (report/rules.series_labels)
    family: Part | None = None  # its part of a case family's name (report/rules.case_family)
    # a column that is not a Case field of its own: its cell from a case, and the field its
    # cell is read back into
    cell: Callable | None = None
    field: str | None = None

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

    def value(self, case):
        """``case``'s cell in this dimension's column."""
        return getattr(case, self.name) if self.cell is None else self.cell(case)

    def flags(self, case) -> list[str]:
        """The sweep flags that select ``case``'s value of this dimension (repro.py)."""
        if self.repro is not None:
            return self.repro(case)
        value = self.value(case)
        if not self.options or value is None or value == "":
            return []
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return ["--" + self.options[0].replace("_", "-"), text]

    @property
    def later(self) -> bool:
        """A key column added after the first runs: older rows lack it."""
        return self.old is not REQUIRED


def _blank(value) -> bool:
    """A cell with nothing in it: None, NaN or pandas' NA (whose truth is undefined)."""
    return value is None or str(value) in ("", "nan", "<NA>", "None")


def _true(value) -> bool:
    return not _blank(value) and bool(value)


def _said(value) -> str:
    return "" if _blank(value) else str(value)


def _causal_family(r) -> str:
    if not _true(r["causal"]):
        return "full"
    return "causal bottom-right" if r["causal_align"] == "bottom_right" else "causal"


def _mask_family(r) -> str:
    mask = _said(r["mask"])
    if mask in ("", "none"):
        return ""
    return f"window{_said(r['window'])}" if mask == "window" else mask


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
        legend=Part(2, lambda r: _said(r["mode"])),
        family=Part(3, lambda r: _said(r["mode"])),
    ),
    Dim(
        "batch",
        int,
        "B",
        ("batch",),
        part=lambda c: f"B{c.batch}",
        rank=2,
        title="B=",
        # a series' batch: B4, or B·N=16384 where the grid holds the token count
        # (report/rules.batch_rule)
        legend=Part(9, lambda r: _said(r["batch_rule"]).replace("B=", "B")),
    ),
    Dim(
        "heads",
        int,
        "Hq, query heads",
        ("heads",),
        part=lambda c: f" H{c.heads}",
        rank=3,
        title="H=",
        # with the key/value heads when fewer: H32/8
        legend=Part(
            10,
            lambda r: (
                f"H{r['heads']}" + (f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else "")
            ),
        ),
    ),
    Dim(
        "kv_heads",
        int,
        "Hkv, key/value heads (< heads: GQA/MQA)",
        ("kv_heads",),
        part=lambda c: f"/{c.kv_heads}" if c.kv_heads != c.heads else "",
        rank=4,
        title="Hkv=",
        family=Part(9, lambda r: "gqa" if r["kv_heads"] < r["heads"] else ""),
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
        family=Part(10, lambda r: "cross" if r["seq_kv"] != r["seq_q"] else ""),
    ),
    Dim(
        "head_dim",
        int,
        "D",
        ("head_dim",),
        part=lambda c: f" D{c.head_dim}",
        rank=7,
        title="D=",
        legend=Part(11, lambda r: f"D{r['head_dim']}"),
        family=Part(6, lambda r: f"D{r['head_dim']}"),
    ),
    Dim(
        "dtype",
        str,
        "float32, bfloat16 or float16",
        ("dtype",),
        part=lambda c: f" {c.dtype}",
        rank=8,
        title="",
        legend=Part(8, lambda r: _said(r["dtype"])),
        family=Part(4, lambda r: _said(r["dtype"])),
    ),
    Dim(
        "causal",
        bool,
        "causal mask, aligned as causal_align says",
        ("causal",),
        part=lambda c: " causal" if c.causal else " full",
        rank=9,
        title="causal=",
        legend=Part(3, lambda r: "causal" if _true(r["causal"]) else "full"),
        family=Part(5, _causal_family),
    ),
    # one device per sweep: --device is the Spec's own field, not a list to sweep
    Dim(
        "device",
        str,
        "cpu or cuda",
        title="",
        legend=Part(13, lambda r: _said(r["device"]), always=False),
        family=Part(0, lambda r: _said(r["device"]), always=False),
    ),
    Dim(
        "mask",
        str,
        f"the mask kind (attnbench/masks/): {', '.join(KINDS)} or a plugin's; combines with causal",
        ("mask",),
        part=_mask_part,  # with the window or the pattern, which have no part of their own
        rank=11,
        title="mask=",
        repro=_mask_flags,
        legend=Part(
            4, lambda r: "no mask" if r["mask"] == "none" else _said(r["mask"]), always=False
        ),
        family=Part(7, _mask_family),  # with the window
    ),
    Dim(
        "window",
        int,
        "window width W with mask=window (the kind's spec), else blank",
        ("window",),
        title="W=",
        repro=lambda c: [],  # --mask window:W carries it
        legend=Part(5, lambda r: "" if _blank(r["window"]) else f"W{r['window']}", always=False),
        cell=lambda c: int(c.pattern) if c.mask == "window" else None,
        field="pattern",  # the window's spec has its own column
    ),
    Dim(
        "level",
        str,
        "op (attention alone) or layer (projections + attention + output projection)",
        ("level",),
        part=lambda c: " layer" if c.level == "layer" else "",
        rank=13,
        title="level=",
        legend=Part(12, lambda r: f"level={_said(r['level'])}", always=False),
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
        # after causal, and only on a causal series: causal top-left, causal bottom-right
        legend=Part(
            3.5,
            lambda r: _said(r["causal_align"]).replace("_", "-") if _true(r["causal"]) else "",
            always=False,
        ),
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
        legend=Part(0, lambda r: _said(r["model"]), always=False),
        family=Part(1, lambda r: _said(r["model"])),
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
        legend=Part(1, lambda r: _said(r["phase"]), always=False),
        family=Part(2, lambda r: _said(r["phase"])),
    ),
    Dim(
        "pattern",
        str,
        "the mask kind's spec, defaults filled in: document the --docs spec (fixed:LEN, "
        "uniform:MIN-MAX or LEN+LEN+...); block_sparse and strided the --sparsity spec; "
        "prefix_lm the prefix (P or PCT%); a plugin kind its spec; else blank (window: W "
        "is in the window column)",
        ("docs", "sparsity"),
        old=None,
        title="",
        repro=lambda c: [],  # --mask KIND:SPEC carries it
        legend=Part(6, lambda r: _said(r["pattern"]), always=False),
        cell=lambda c: None if c.mask == "window" else c.pattern,
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
        legend=Part(7, lambda r: _said(r.get("score_mod")) or "no score_mod", always=False),
        family=Part(8, lambda r: _said(r.get("score_mod"))),
    ),
)
DIM = {d.name: d for d in DIMS}
SPEC_COLUMNS = tuple(d.name for d in DIMS if (d.field or d.name) == "pattern")  # a mask's spec
LABEL_PARTS = sorted((d for d in DIMS if d.part), key=lambda d: d.rank)
LEGEND_PARTS = sorted((d for d in DIMS if d.legend), key=lambda d: d.legend.rank)
FAMILY_PARTS = sorted((d for d in DIMS if d.family), key=lambda d: d.family.rank)


def label(case, leave_out: tuple[str, ...] = ()) -> str:
    """The case's label, e.g. 'B1 H4/2 S128x256 D64 float32 causal bottom-right window64
    fwd': each dimension's part (store/rundir.py's grid.json and draws file key cases by it,
    so it never changes for a case). ``leave_out`` drops the parts of the dimensions that
    vary within a series or family; ``case`` is anything with the dimensions as attributes."""
    text = "".join(d.part(case) for d in LABEL_PARTS if d.name not in leave_out)
    return " ".join(text.split()) if leave_out else text
