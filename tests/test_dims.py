"""The case dimensions are declared once (attnbench/dims.py); Case, the schema, the sweep's
options and the label follow from them."""

from attnbench.case import Case
from attnbench.dims import DIMS, label
from attnbench.options import OPTIONS
from attnbench.spec import SPEC_OPTIONS, Spec
from attnbench.store.schema import CASE_KEY, COLUMNS, LATER_KEYS


def test_every_dimension_is_a_case_field_a_column_and_part_of_the_key():
    assert [d.name for d in DIMS] == list(CASE_KEY[1:])
    assert {d.name for d in DIMS} == set(Case.__dataclass_fields__)
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
        window=80,
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
    text = {k: ("" if v is None else str(v)) for k, v in case.as_dict().items()}
    assert Case.from_row(text) == case  # a CSV line's text: 'True' is True
    assert Case.from_row({**text, "causal": "False"}).causal is False
