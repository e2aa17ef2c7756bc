"""Vocabulary dates: day numbers from every form a date column is read in, and back to strings."""

import numpy as np
import pyarrow as pa

from pipeline.vocab.dates import date_indices, day_dictionary, day_numbers, day_strings


def test_day_numbers_read_strings_dictionaries_and_date32_alike():
    days = np.array([20000, 20001, 20000, 19000, 20003], np.int64)
    text = pa.array(days.astype("datetime64[D]")).cast(pa.string())
    for dates in (
        text,
        text.cast(pa.large_string()),
        day_dictionary(days),
        text.cast(pa.date32()),
        pa.chunked_array([day_dictionary(days[:2]), day_dictionary(days[2:])]),
        text.to_pandas(),
    ):
        np.testing.assert_array_equal(day_numbers(dates), days)
    spread = np.array([0, 1 << 17, 5], np.int64)  # a span too wide for a range of names: the distinct days instead
    np.testing.assert_array_equal(day_numbers(day_dictionary(spread)), spread)
    assert len(day_numbers(day_dictionary(np.empty(0, np.int64)))) == 0


def test_day_strings_format_day_numbers_as_iso_dates():
    assert day_strings(np.array([0, 20454, 0], np.int64)).tolist() == ["1970-01-01", "2026-01-01", "1970-01-01"]
    assert day_strings(np.array([0, 1 << 17], np.int64)).tolist() == ["1970-01-01", "2328-11-12"]


def test_date_indices_of_one_dictionary_chunk_or_several_chunks_point_at_the_same_days():
    days = np.array([20003, 20000, 20003, 19990], np.int64)
    for column in (
        pa.chunked_array([day_dictionary(days)]),
        pa.chunked_array([day_dictionary(days[:1]), day_dictionary(days[1:])]),
    ):
        indices, numbers = date_indices(column)
        assert indices.dtype == np.int32
        np.testing.assert_array_equal(numbers[indices], days)
