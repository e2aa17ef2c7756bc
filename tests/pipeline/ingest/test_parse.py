"""Parsing raw lines: one test per quarantine rule and per accepted quirk.

Invariant everywhere: rows_read = events + quarantine + rows_other_dates, and
quarantine.line is the true 1-based line number in the file.
"""

import numpy as np
import pandas as pd
import pytest

from pipeline.ingest.parse import parse_chunk, parse_table, read_log_file
from pipeline.schema import AVAZU, CRITEO
from tests.helpers.raw_days import criteo_text

AVAZU_HEADER = ",".join(AVAZU.columns)


def criteo_line(label="1", ints=None, cats=None) -> str:
    ints = [str(i) for i in range(13)] if ints is None else ints
    cats = [f"{j:08x}" for j in range(26)] if cats is None else cats
    return "\t".join([label, *ints, *cats])


def avazu_line(click="0", hour="14102100") -> str:
    return ",".join(["123", click, hour, *["v"] * 21])


def parse(lines: list[str], schema=CRITEO, **kw):
    parsed = parse_chunk(("\n".join(lines) + "\n").encode(), schema=schema, file="f.tsv", **kw)
    assert parsed.rows_read == len(parsed.events) + len(parsed.quarantine) + parsed.rows_other_dates
    return parsed


def the_reason(parsed) -> str:
    assert len(parsed.quarantine) == 1
    return parsed.quarantine["reason"].iloc[0]


def test_a_good_criteo_line_becomes_a_typed_event():
    p = parse([criteo_line(cats=["" if j == 4 else "ab" for j in range(26)])])
    e = p.events
    assert len(e) == 1 and len(p.quarantine) == 0
    assert e["label"].dtype == np.int8 and e["label"].iloc[0] == 1
    assert e["I13"].dtype == np.float32 and e["I13"].iloc[0] == 12.0
    assert e["C1"].iloc[0] == "ab" and e["C5"].isna().iloc[0]  # empty -> null
    assert e["ts"].isna().all() and e["order"].iloc[0] == 1


def test_order_is_file_index_and_line_number():
    p = parse([criteo_line(), criteo_line()], file_index=3, first_line=11)
    assert p.events["order"].tolist() == [3 * 2**40 + 11, 3 * 2**40 + 12]


def test_too_many_fields_is_quarantined_with_its_line_number():
    p = parse([criteo_line(), criteo_line() + "\textra"], first_line=100)
    assert "wrong field count: 41" in the_reason(p)
    assert p.quarantine["line"].tolist() == [101] and p.quarantine["file"].tolist() == ["f.tsv"]


def test_fewer_than_label_plus_13_integers_is_quarantined():
    assert "wrong field count: 13" in the_reason(parse(["\t".join(["0"] * 13)]))


def test_stripped_trailing_fields_are_read_as_missing():
    p = parse([criteo_line(cats=["aa", "bb"])])  # 16 of 40 fields
    assert len(p.events) == 1 and p.events["C2"].iloc[0] == "bb" and p.events["C26"].isna().all()


def test_non_numeric_integer_field_is_quarantined():
    ints = [str(i) for i in range(13)]
    ints[2] = "12abc"
    assert the_reason(parse([criteo_line(ints=ints)])) == "non-numeric integer field: I3='12abc'"


def test_integers_written_as_floats_are_accepted():
    ints = ["260.0", "-1", *[""] * 11]
    p = parse([criteo_line(ints=ints)])
    assert p.events["I1"].iloc[0] == 260.0 and p.events["I2"].iloc[0] == -1.0 and p.events["I3"].isna().all()


@pytest.mark.parametrize("label", ["2", "", "yes", "1.0"])
def test_label_must_be_0_or_1(label):
    assert the_reason(parse([criteo_line(label=label)])).startswith("bad label")


def test_undecodable_bytes_are_quarantined_backslash_escaped():
    data = criteo_line().encode() + b"\n" + criteo_line(cats=["\xe9t\xe9"] * 26).encode("latin-1") + b"\n"
    p = parse_chunk(data, schema=CRITEO, file="f.tsv")
    assert len(p.events) == 1 and p.quarantine["line"].tolist() == [2]
    assert p.quarantine["reason"].iloc[0] == "undecodable bytes: not UTF-8"
    assert "\\xe9t\\xe9" in p.quarantine["raw"].iloc[0]


def test_blank_lines_are_quarantined_so_every_line_is_accounted_for():
    p = parse([criteo_line(), "", "  ", criteo_line()])
    assert p.rows_read == 4 and len(p.events) == 2
    assert p.quarantine["reason"].tolist() == ["blank line", "blank line"]
    assert p.quarantine["line"].tolist() == [2, 3]


def test_crlf_line_ends_are_stripped():
    data = (criteo_line() + "\r\n" + criteo_line() + "\r\n").encode()
    p = parse_chunk(data, schema=CRITEO, file="f")
    assert len(p.events) == 2 and p.events["C26"].tolist() == ["00000019"] * 2


def test_a_bom_on_line_1_is_ignored():
    p = parse_chunk(b"\xef\xbb\xbf" + criteo_line().encode() + b"\n", schema=CRITEO, file="f")
    assert len(p.events) == 1 and p.events["label"].iloc[0] == 1


def test_a_last_line_without_newline_is_a_row():
    p = parse_chunk((criteo_line() + "\n" + criteo_line()).encode(), schema=CRITEO, file="f")
    assert len(p.events) == 2


def test_the_avazu_header_is_not_a_row_and_line_numbers_count_it():
    p = parse([AVAZU_HEADER, avazu_line(), avazu_line(click="x")], schema=AVAZU)
    assert p.rows_read == 2 and len(p.events) == 1
    assert p.quarantine["line"].tolist() == [3] and p.quarantine["reason"].iloc[0].startswith("bad label")
    assert p.events["order"].tolist() == [2]


def test_a_header_only_counts_on_line_1():
    p = parse([avazu_line(), AVAZU_HEADER], schema=AVAZU, first_line=5)
    assert "bad timestamp" in the_reason(p)


def test_a_header_with_other_columns_is_an_error_naming_the_file():
    with pytest.raises(ValueError, match="f.tsv: line 1"):
        parse(["id,clicked,hour", avazu_line()], schema=AVAZU)


def test_avazu_hour_is_the_utc_timestamp():
    p = parse([AVAZU_HEADER, avazu_line(hour="14102105")], schema=AVAZU)
    assert p.events["ts"].iloc[0] == 1413849600 + 5 * 3600


def test_bad_timestamp_is_quarantined():
    assert the_reason(parse([avazu_line(hour="14109999")], schema=AVAZU)).startswith("bad timestamp: hour=")


def test_rows_of_other_dates_are_dropped_and_counted():
    p = parse(
        [avazu_line(hour="14102023"), avazu_line(hour="14102100"), avazu_line(hour="14102200")],
        schema=AVAZU,
        first_line=2,
        date="2014-10-21",
    )
    assert len(p.events) == 1 and p.rows_other_dates == 2 and len(p.quarantine) == 0


def test_read_log_file_reads_a_whole_small_file(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text(criteo_line() + "\n" + "bad\n")
    events, quarantine = read_log_file(str(path), "criteo")
    assert len(events) == 1 and quarantine["line"].tolist() == [2]


def test_real_criteo_sample_parses_clean(shared_data):
    events, quarantine = read_log_file(str(shared_data / "criteo" / "train_head_10k.tsv"), "criteo")
    assert len(events) == 10_000 and len(quarantine) == 0
    assert abs(events["label"].mean() - 0.218) < 1e-3


def test_a_chunk_of_many_csv_reader_blocks_parses_like_line_by_line():
    lines = [criteo_line(str(i % 2), [str(i), *[""] * 12], [f"{i:08x}", *["abcdef01"] * 25]) for i in range(9000)]
    data = ("\n".join(lines) + "\n").encode()
    assert len(data) > 2 * (1 << 20)  # the fast path reads 1 MiB blocks
    fast = parse_table(data, schema=CRITEO, file="f.tsv")
    slow = parse_table(data + b"x\ty\n", schema=CRITEO, file="f.tsv")  # one short line: per-line path
    assert fast.fast_path and not slow.fast_path and slow.quarantine.column("line").to_pylist() == [9001]
    pd.testing.assert_frame_equal(fast.events.to_pandas(), slow.events.to_pandas())
    assert fast.events.column("I1").to_pylist() == list(range(9000))
    assert fast.events.column("C1").to_pylist() == [f"{i:08x}" for i in range(9000)]


def test_a_line_longer_than_a_csv_reader_block_is_still_a_row():
    long_value = "v" * (3 << 20)
    data = ("\n".join([criteo_line(), criteo_line(cats=[long_value] * 26), criteo_line()]) + "\n").encode()
    parsed = parse_table(data, schema=CRITEO, file="f.tsv")
    assert not parsed.fast_path and parsed.events.num_rows == 3 and parsed.quarantine.num_rows == 0
    assert parsed.events.column("C26")[1].as_py() == long_value


def test_fast_path_and_per_line_path_give_the_same_rows(raw_days):
    data = criteo_text(raw_days, 500)
    lines = data.splitlines(True)
    fast = parse_table(data, schema=CRITEO, file="f", first_line=3)
    assert fast.fast_path
    broken = b"".join(lines[:100] + [b"x\ty\n"] + lines[100:])  # one short line: per-line path
    slow = parse_table(broken, schema=CRITEO, file="f", first_line=3)
    assert not slow.fast_path and slow.quarantine.column("line").to_pylist() == [103]
    a, b = fast.events.to_pandas(), slow.events.to_pandas()
    b.loc[b.index >= 100, "order"] -= 1
    pd.testing.assert_frame_equal(a, b)
    bad_value = b"".join(lines[:10] + [lines[10].replace(b"\t", b"\tabc\t", 1).replace(b"\t", b"", 2)] + lines[11:])
    mixed = parse_chunk(bad_value, schema=CRITEO, file="f")  # a non-number: string fast path, value check
    assert len(mixed.events) + len(mixed.quarantine) == 500
