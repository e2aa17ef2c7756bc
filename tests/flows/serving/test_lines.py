"""A request line is read by its field count (with or without the label, only the columns the model reads), a count
with two readings is refused unless the request says "labelled", and every entry becomes a whole line of the format."""

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
    out, errors = with_labels([features], CRITEO, labelled=False)
    assert errors == [] and out == ["0\t" + features]  # the label column is Criteo's first
    assert with_labels([labelled], CRITEO) == ([labelled], [])


def test_the_label_goes_where_the_schema_puts_it_and_the_timestamp_is_the_placeholder():
    row = [f"v{k}" for k in range(len(AVAZU.columns))]
    row[AVAZU.columns.index("click")] = "1"
    without = [v for c, v in zip(AVAZU.columns, row, strict=True) if c != "click"]
    out, errors = with_labels([",".join(without), ",".join(row)], AVAZU)
    expected = list(row)
    expected[AVAZU.columns.index("hour")] = "70010100"  # only dates rows: never read, never checked
    labelled = ",".join(expected)
    expected[AVAZU.columns.index("click")] = "0"
    assert errors == [] and out == [",".join(expected), labelled]


def test_a_wrong_field_count_names_the_counts_with_and_without_the_label():
    out, errors = with_labels([_criteo_features(0) + "\textra\tmore", "1\t2", ""], CRITEO)
    assert out[:2] == [None, None] and out[2] == ""  # a blank line keeps ingest's reason ("blank line")
    assert errors == [
        (0, "wrong field count: 41 fields, expected 14..40 with the label column 'label' or 39 without it"),
        (1, "wrong field count: 2 fields, expected 14..40 with the label column 'label' or 39 without it"),
    ]
    _, errors = with_labels(["a,b"], AVAZU)
    assert errors == [
        (
            0,
            "wrong field count: 2 fields, expected 24 with the label column 'click' or 23 without it or 21 of the "
            "columns the model reads (22 with the timestamp 'hour')",
        )
    ]


def test_cut_lines_are_read_as_labelled_unless_the_request_says_features_only():
    cut = "\t".join(str(j) for j in range(20))  # Criteo copies strip trailing empty fields: 14..40 with the label
    assert with_labels([cut], CRITEO) == ([cut + "\t" * 20], [])  # written whole, as ingest pads it
    assert with_labels([cut], CRITEO, labelled=False) == (["0\t" + cut + "\t" * 19], [])
    full = "1\t" + _criteo_features(0)
    out, errors = with_labels([full], CRITEO, labelled=False)
    assert out == [None] and errors == [
        (
            0,
            "wrong field count: 40 fields, expected 13..39 without the label column "
            "'label' (the request says \"labelled\": false)",
        )
    ]
    assert with_labels([_criteo_features(0)], CRITEO, labelled=True) == ([_criteo_features(0) + "\t"], [])


@pytest.mark.parametrize("labelled", [None, False])
def test_a_trailing_label_column_is_appended(labelled):
    from pipeline.schema import LogSchema

    schema = LogSchema(
        name="t", separator=";", has_header=False, columns=("a", "b", "y"), label="y", dense=("a",), categorical=("b",)
    )
    assert with_labels(["1;x"], schema, labelled=labelled) == (["1;x;0"], [])


def test_a_count_with_two_readings_is_refused_naming_both_unless_the_request_says_labelled():
    """Issue 51: a labelled Criteo line whose trailing empty field was dropped has 39 fields, as a features-only line:
    read as features-only, every column shifted by one and was scored without complaint."""
    cut = "1\t" + "\t".join(_criteo_features(5).split("\t")[:-1])  # labelled, C26 empty and dropped: 39 fields
    out, errors = with_labels([cut], CRITEO)
    assert out == [None] and errors == [
        (
            0,
            "ambiguous field count: 39 fields are a labelled line cut short (its last empty field dropped) or a line "
            'without the label column \'label\': say "labelled": true or false beside "lines", or name the columns',
        )
    ]
    assert with_labels([cut], CRITEO, labelled=True) == ([cut + "\t"], [])
    assert with_labels([cut], CRITEO, labelled=False) == (["0\t" + cut], [])


def test_a_line_of_only_the_columns_the_model_reads_and_the_natural_line_with_the_timestamp_are_read():
    row = {c: f"v{k}" for k, c in enumerate(AVAZU.columns)}
    used = ",".join(row[c] for c in AVAZU.request_columns)  # no id, no click, no hour
    natural = ",".join(row[c] for c in AVAZU.columns if c not in ("id", "click"))
    whole = {**row, "id": "", "click": "0", "hour": "70010100"}
    expected = ",".join(whole[c] for c in AVAZU.columns)
    assert AVAZU.request_columns == AVAZU.categorical and CRITEO.request_columns == CRITEO.columns[1:]
    assert with_labels([used, natural], AVAZU) == ([expected, expected], [])
    assert with_labels([used], AVAZU, labelled=False) == ([expected], [])


def test_named_columns_come_as_csv_with_a_header():
    from flows.serving.lines import csv_rows

    rows, errors = csv_rows('C1,I1\r\n"a,b",5\n\nx,\n1,2,3\n')
    assert rows == [{"C1": "a,b", "I1": "5"}, {"C1": "x"}, None]
    assert errors == [(2, "wrong field count: 3 fields, the CSV header names 2")]
    for bad, message in (("", "header record"), ("a,a\n1,2", "each column once"), ('a\n"x', "invalid CSV")):
        with pytest.raises(ValueError, match=message):
            csv_rows(bad)
