"""What row_advice says for the reasons and columns the e2e test leaves out: a label read by a
threshold or a mapping, a blank line before rows, a sequence's side value, an integer id column."""

from __future__ import annotations

from shardrec.dataloader.spec.feature_spec import CategoricalColumn, FeatureSpec, LabelColumn
from shardrec.dataloader.spec.text_format import TextFormat
from shardrec.tools.preprocess.tasks.row_advice import row_advice

SKIP = "skip such rows with --max-skipped-fraction 0.01"


def _spec(label: LabelColumn) -> FeatureSpec:
    ids = CategoricalColumn("item", kind="integer")
    return FeatureSpec(TextFormat(kind="csv", header=True), (label, ids))


def test_a_label_read_by_a_rule_names_what_it_reads() -> None:
    rated = _spec(LabelColumn("rating", threshold=4.0))
    assert row_advice("bad_label", "rating", rated, False, SKIP) == (
        f"; the label column rating reads numbers and is never missing: correct the row or {SKIP}"
    )
    mapped = _spec(LabelColumn("clicked", mapping={"yes": 1, "no": 0}))
    assert row_advice("bad_label", "clicked", mapped, False) == (
        "; the label column clicked reads one of its mapping's values ('yes', 'no') and is never "
        "missing: correct the row"
    )


def test_an_integer_id_column_a_blank_line_and_a_side_value() -> None:
    spec = _spec(LabelColumn("click"))
    assert row_advice("bad_integer", "item", spec, False, SKIP) == (
        "; item reads whole numbers, a missing value as an empty field: correct the row, give "
        f'item kind = "string" (any value, hashed), or {SKIP}'
    )
    assert row_advice("empty_row", "row", spec, False, SKIP) == f"; remove the line or {SKIP}"
    assert row_advice("side_length", "times", spec, False) == (
        "; times needs a value at each position of the sequence it is a side of: correct the row"
    )
