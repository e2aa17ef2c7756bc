"""A request line with the label column, or without it (features only), is told apart by its field count."""

from __future__ import annotations

import pytest

from flows.serving.lines import with_labels
from pipeline.schema import get_schema

CRITEO = get_schema("criteo")
AVAZU = get_schema("avazu")


def _criteo_features(i: int) -> str:
    return "\t".join([*(str(i + j) for j in range(13)), *(f"c{j}v{i}" for j in range(26))])


def test_a_features_only_line_gets_the_label_written_in_and_a_labelled_one_is_kept():
    features = _criteo_features(3)
    labelled = "1\t" + features
    out, errors = with_labels([features, labelled], CRITEO)
    assert errors == [] and out == ["0\t" + features, labelled]  # the label column is Criteo's first


def test_the_label_goes_where_the_schema_puts_it():
    row = [f"v{k}" for k in range(len(AVAZU.columns))]
    row[AVAZU.columns.index("click")] = "1"
    without = [v for c, v in zip(AVAZU.columns, row, strict=True) if c != "click"]
    out, errors = with_labels([",".join(without), ",".join(row)], AVAZU)
    expected = list(row)
    expected[AVAZU.columns.index("click")] = "0"
    assert errors == [] and out == [",".join(expected), ",".join(row)]


def test_a_wrong_field_count_names_the_counts_with_and_without_the_label():
    out, errors = with_labels([_criteo_features(0) + "\textra\tmore", "1\t2", ""], CRITEO)
    assert out[:2] == [None, None] and out[2] == ""  # a blank line keeps ingest's reason ("blank line")
    assert errors == [
        (0, "wrong field count: 41 fields, expected 14..40 with the label column 'label' or 39 without it"),
        (1, "wrong field count: 2 fields, expected 14..40 with the label column 'label' or 39 without it"),
    ]
    _, errors = with_labels(["a,b"], AVAZU)
    assert errors == [(0, "wrong field count: 2 fields, expected 24 with the label column 'click' or 23 without it")]


def test_cut_lines_are_read_as_labelled_unless_the_request_says_features_only():
    cut = "\t".join(str(j) for j in range(20))  # Criteo copies strip trailing empty fields: 14..40 with the label
    assert with_labels([cut], CRITEO) == ([cut], [])
    assert with_labels([cut], CRITEO, labelled=False) == (["0\t" + cut], [])
    full = "1\t" + _criteo_features(0)
    out, errors = with_labels([full], CRITEO, labelled=False)
    assert out == [None] and errors == [
        (
            0,
            "wrong field count: 40 fields, expected 13..39 without the label column "
            "'label' (the request says \"labelled\": false)",
        )
    ]
    assert with_labels([_criteo_features(0)], CRITEO, labelled=True) == ([_criteo_features(0)], [])


@pytest.mark.parametrize("labelled", [None, False])
def test_a_trailing_label_column_is_appended(labelled):
    from pipeline.schema import LogSchema

    schema = LogSchema(
        name="t", separator=";", has_header=False, columns=("a", "b", "y"), label="y", dense=("a",), categorical=("b",)
    )
    assert with_labels(["1;x"], schema, labelled=labelled) == (["1;x;0"], [])
