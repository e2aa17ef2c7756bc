"""Quarantined rows explained: counts per reason with a sample line, and advice that fits the mistake."""

from collections import Counter

from pipeline.ingest.bad_rows import advice, describe_reasons, merge_samples, tally
from pipeline.ingest.parse import parse_table
from pipeline.schema import AVAZU, CRITEO, schema_from_dict

SHOP = schema_from_dict(
    {
        "columns": ["ts", "clicked", "site"],
        "label": "clicked",
        "categorical": ["site"],
        "timestamp": {"column": "ts", "format": "%d/%m/%Y"},
    },
    default_name="shop",
)


def _tally(data: bytes, schema, file="f.tsv"):
    counts, samples = Counter(), {}
    tally(parse_table(data, schema=schema, file=file).quarantine, counts, samples)
    return counts, samples


def test_tally_counts_reasons_by_category_and_keeps_the_first_line_of_each():
    good = "0" + "\t1" * 13 + "\tabc" * 26
    counts, samples = _tally(f"{good}\nx\ty\n1\t2\t3\n5\t{'1' * 3}\n".encode(), CRITEO)
    assert counts == {"wrong field count": 3}
    assert samples["wrong field count"] == {
        "file": "f.tsv",
        "line": 2,
        "raw": "x\ty",
        "reason": "wrong field count: 2 fields, expected 14..40",
    }


def test_merge_keeps_the_earlier_sample():
    into = {"blank line": {"line": 3}}
    merge_samples(into, {"blank line": {"line": 9}, "bad label": {"line": 4}})
    assert into == {"blank line": {"line": 3}, "bad label": {"line": 4}}


def test_reasons_read_as_count_sample_file_line_and_detail():
    counts, samples = _tally(b"a\tb\n" * 5 + b"\n", CRITEO)
    assert describe_reasons(counts, samples) == [
        "wrong field count x5, e.g. f.tsv line 1: 2 fields, expected 14..40",
        "blank line x1, e.g. f.tsv line 6",
    ]


def test_a_few_bad_rows_may_be_accepted_but_a_schema_mistake_is_not_a_fraction_to_raise():
    counts, samples = _tally(b"a\tb\n", CRITEO)
    few = advice(
        counts,
        samples,
        share=0.02,
        schema=CRITEO,
        format_key="input.format",
        fmt="criteo",
        tolerance="raise ingest.max_bad_fraction (now 0.01)",
    )
    assert few == "fix or remove the malformed rows, or raise ingest.max_bad_fraction (now 0.01) to go on without them"
    most = advice(
        counts,
        samples,
        share=1.0,
        schema=CRITEO,
        format_key="input.format",
        fmt="criteo",
        tolerance="raise ingest.max_bad_fraction (now 0.01)",
    )
    assert "max_bad_fraction" not in most and "check input.format ('criteo')" in most


def test_lines_that_split_on_another_separator_name_it():
    counts, samples = _tally(b"1,0,site\n" * 3, SHOP)  # the schema's separator is the default tab
    text = advice(counts, samples, share=1.0, schema=SHOP, format_key="input.format", fmt="shop.yaml")
    assert text.startswith("the lines split into the shop columns on ',', not on '\\t': set separator: ','")


def test_a_timestamp_mistake_names_the_column_and_format_to_fix():
    counts, samples = _tally(b"2026-02-01,0,s\n".replace(b",", b"\t"), SHOP)
    assert counts == {"bad timestamp": 1}
    assert samples["bad timestamp"]["reason"] == "bad timestamp: ts='2026-02-01', expected format '%d/%m/%Y'"
    text = advice(counts, samples, share=1.0, schema=SHOP, format_key="input.format", fmt="shop.yaml")
    assert text == "ts values do not read as '%d/%m/%Y': fix timestamp.format in the schema file shop.yaml"


def test_label_and_number_mistakes_point_at_the_schema_roles():
    labels = Counter({"bad label": 4})
    assert "label column 'click' does not hold 1/0" in advice(
        labels, {}, share=0.9, schema=AVAZU, format_key="--format", fmt="avazu"
    )
    numbers = Counter({"non-numeric integer field": 4})
    assert "integer and float columns in --format ('criteo')" in advice(
        numbers, {}, share=0.9, schema=CRITEO, format_key="--format", fmt="criteo"
    )
