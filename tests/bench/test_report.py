"""docs/benchmarks.md's tables are what `bench._report` generates from the committed bench/results/*.json.

A table edited by hand, or a result rerun without regenerating the page, fails here; so does a result that lacks
its commit, machine or date, or grows into a log.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from bench import _report as report
from bench._results import TRANSCRIBED, dumps

DOC_TEXT = report.DOC.read_text()
RESULT_FILES = sorted(report.RESULTS.glob("*.json"))
MAX_RESULT_BYTES = 32_000
"""A committed result holds a table's rows and the numbers the page shows, not per-step or per-seed logs."""


def test_the_tables_in_docs_benchmarks_md_are_what_the_committed_results_give():
    assert not report.stale(DOC_TEXT), "run `python -m bench._report` and commit docs/benchmarks.md"
    assert report.rewrite(DOC_TEXT) == DOC_TEXT


def test_every_table_has_its_place_in_the_page_and_every_result_a_table():
    placed = [m.group("name") for m in report.BLOCK.finditer(DOC_TEXT)]
    assert sorted(placed) == sorted(report.TABLES), "each table of bench._report.TABLES appears once"
    assert {t.result for t in report.TABLES.values()} == {p.stem for p in RESULT_FILES}


def test_the_generator_is_deterministic():
    first = report.rewrite(DOC_TEXT)
    assert report.rewrite(DOC_TEXT) == first
    assert report.rewrite(first) == first  # regenerating a fresh page changes nothing
    for table in report.TABLES.values():
        result = report.load(report.RESULTS, table.result)
        shuffled = dict(random.Random(0).sample(sorted(result.items()), len(result)))  # key order is not an input
        assert report.render(table, shuffled) == report.render(table, result)


def test_each_result_is_small_and_says_where_its_numbers_come_from():
    for path in RESULT_FILES:
        result = json.loads(path.read_text())
        assert {"commit", "date", "machine"} <= set(result), f"{path.name} lacks its stamp"
        assert {"cpus", "cpu_model", "platform", "memory_gib"} <= set(result["machine"]), path.name
        assert path.read_text() == dumps(result), f"{path.name} is not as bench._results writes it"
        assert len(path.read_bytes()) <= MAX_RESULT_BYTES, f"{path.name}: move its logs to bench._results.RAW_KEYS"
        if "source" in result:
            assert result["source"].startswith(TRANSCRIBED), path.name


@pytest.mark.subprocess  # git rev-parse HEAD
def test_a_fresh_result_is_stamped_and_keeps_its_raw_detail_beside_it(tmp_path: Path, monkeypatch):
    from bench import _common

    monkeypatch.setenv(_common.RESULTS_ENV, str(tmp_path))
    path = _common.write_json("x", {"rows": [{"run": "a", "s": 1 / 3}], "raw": {"per_step": list(range(5))}})
    result = json.loads(path.read_text())
    assert result["rows"] == [{"run": "a", "s": 0.333333}] and "raw" not in result
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", result["commit"]), result["commit"]
    assert result["date"] == result["environment"]["time"][:10] and result["machine"]["cpus"] >= 1
    assert json.loads((tmp_path / "raw" / "x.json").read_text()) == {"raw": {"per_step": [0, 1, 2, 3, 4]}}


def test_a_table_renders_missing_values_empty_and_reached_rows_with_their_key():
    table = report.Table(
        "t", "t", (report.Column("_key", "leg"), report.Column("a.b", "b", "{:.1f}")), rows="legs.*", footer=False
    )
    result = {"legs": {"x": {"a": {"b": 2}}, "y": {}, "status": "ok"}}
    assert report.render(table, result).splitlines()[2:4] == ["| x | 2.0 |", "| y |  |"]
