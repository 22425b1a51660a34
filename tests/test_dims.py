"""The case dimensions are declared once (attnbench/dims.py); Case, the schema, the sweep's
options and the label follow from them."""

import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.dims import DIMS, label
from attnbench.options import OPTIONS
from attnbench.spec import SPEC_OPTIONS, Spec
from attnbench.store.schema import CASE_KEY, COLUMNS, LATER_KEYS


def test_every_dimension_is_a_case_field_a_column_and_part_of_the_key():
    assert [d.name for d in DIMS] == list(CASE_KEY[1:])
    assert {d.field or d.name for d in DIMS} == set(Case.__dataclass_fields__)
    for d in DIMS:
        assert COLUMNS[d.name] == (d.dtype, d.meaning)
    assert LATER_KEYS == {
        "causal_align": "top_left",
        "model": None,
        "phase": None,
        "pattern": None,
        "score_mod": None,
    }


def test_every_dimension_option_is_an_option_and_a_spec_field():
    for option in SPEC_OPTIONS:
        assert option in OPTIONS and option in Spec.__dataclass_fields__, option


def test_the_label_has_a_part_per_dimension_and_leaves_out_what_is_asked():
    case = Case(
        batch=2,
        heads=8,
        kv_heads=2,
        seq_q=64,
        seq_kv=128,
        head_dim=32,
        causal=True,
        mask="window",
        pattern="80",
        causal_align="bottom_right",
        model="m",
        phase="decode",
    )
    assert case.label() == "m decode B2 H8/2 S64x128 D32 float32 causal bottom-right window80 fwd"
    assert label(case, leave_out=("batch", "seq_q", "seq_kv")) == (
        "m decode H8/2 D32 float32 causal bottom-right window80 fwd"
    )


def test_from_row_reads_rows_without_the_later_columns():
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=8, seq_kv=8, head_dim=4, causal=True)
    row = {k: v for k, v in case.as_dict().items() if k not in LATER_KEYS}
    assert Case.from_row(row) == case
    text = {k: ("" if v is None else str(v)) for k, v in case.columns().items()}
    assert Case.from_row(text) == case  # a CSV line's text: 'True' is True
    assert Case.from_row({**text, "causal": "False"}).causal is False


def test_a_window_is_its_kinds_spec_and_keeps_its_own_column():
    """The window width W is mask window's spec (Case.pattern), written in the window column
    (pattern blank) as results have always held it, and read back from there."""
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=8, seq_kv=8, head_dim=4, mask="window",
                pattern="3")  # fmt: skip
    cells = case.columns()
    assert cells["window"] == 3 and cells["pattern"] is None
    assert Case.from_row({k: ("" if v is None else str(v)) for k, v in cells.items()}) == case
    assert "window" not in case.as_dict()  # no field of its own


# a value other than the base case's for every dimension, with what it needs besides
VARIANTS = {
    "mode": {"mode": "bwd"},
    "batch": {"batch": 2},
    "heads": {"heads": 4},
    "kv_heads": {"kv_heads": 1},
    "seq_q": {"seq_q": 32},
    "seq_kv": {"seq_kv": 96},
    "head_dim": {"head_dim": 32},
    "dtype": {"dtype": "bfloat16"},
    "causal": {"causal": True},
    "device": {"device": "cuda"},
    "mask": {"mask": "padding"},
    "window": {"mask": "window", "pattern": "8"},
    "level": {"level": "layer"},
    "causal_align": {"causal": True, "causal_align": "bottom_right"},
    "model": {"model": "llama3-8b"},
    "phase": {"phase": "prefill"},
    "pattern": {"mask": "document", "pattern": "fixed:32"},
    "score_mod": {"score_mod": "softcap:50"},
}


def _rows(variants: list[dict]) -> pd.DataFrame:
    from synth import ok_row

    rows = []
    for change in variants:
        for n in (64, 128):
            lengths = {"seq_q": n, "seq_kv": n} | {
                k: v * n // 64 for k, v in change.items() if k in ("seq_q", "seq_kv")
            }
            fields = {"batch": 1, "heads": 2, "kv_heads": 2, "head_dim": 16} | change | lengths
            case = Case(**fields)
            for impl, ms in (("naive", 2.0), ("sdpa", 1.0)):
                rows.append(ok_row("r", impl, case, ms * n / 64, 1.0, flops=1e6 * n))
    return pd.DataFrame(rows)


def test_every_dimension_has_a_variant_here():
    assert set(VARIANTS) == {d.name for d in DIMS}


@pytest.mark.parametrize("name", [d.name for d in DIMS])
def test_a_dimension_held_fixed_or_varying_has_titles_labels_and_families(name):
    """Every figure title, panel, series label and family derives its text from dims.py: a
    new dimension cannot crash a report (a score modifier once did: KeyError)."""
    from attnbench.report.analyse import derived, figure_lines

    for df in (_rows([VARIANTS[name]]), _rows([{}, VARIANTS[name]])):  # fixed, varying
        df = derived.with_series(df)
        title = figure_lines.title("time", df, None)
        panels = figure_lines.panels(df)
        labels = derived.series_labels(df)
        families = derived.case_family(df)
        assert title.startswith("time\n") and panels and labels.notna().all()
        assert families.notna().all()
    if name not in ("seq_q", "seq_kv"):  # the lengths are the axis, not a legend part
        # the two series of each impl are told apart by a legend part the dimension declares
        # (dims.Part), not by the fallback that spells every key column out
        assert labels.nunique() == 2 and not labels.str.contains("mode=").any()
    value = str(VARIANTS[name].get(name, ""))
    if name == "score_mod":  # the series label and family name the modifier
        assert labels.str.contains(value).any() and families.str.contains(value).any()
