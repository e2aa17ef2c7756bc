"""The example of docs/schema.md is true: its schema file loads and reads its sample lines as the page says."""

from __future__ import annotations

import re

from pipeline.ingest.parse import read_log_file
from pipeline.schema import load_schema_file
from tests.helpers.references import REPO

BLOCKS = re.findall(r"(?ms)^```(?:yaml)?\n(.*?)^```", (REPO / "docs" / "schema.md").read_text())


def test_the_example_schema_reads_the_example_lines(tmp_path):
    (spec,) = [b for b in BLOCKS if b.startswith("# schemas/shop.yaml")]
    (lines,) = [b for b in BLOCKS if b.startswith("ts;clicked;")]
    schema_file, log = tmp_path / "shop.yaml", tmp_path / "day_2026-03-01.csv"
    schema_file.write_text(spec)
    log.write_text(lines)
    schema = load_schema_file(str(schema_file))
    assert (schema.name, schema.label, schema.categorical) == ("shop_clicks", "clicked", ("site", "tags"))
    events, quarantine = read_log_file(str(log), str(schema_file))
    assert len(quarantine) == 0, quarantine.to_dict("records")
    assert events["label"].tolist() == [1, 0]
    assert events["price"].tolist() == [12.0, 3.0]
    first, second = events["tags"].iloc[0], events["tags"].iloc[1]
    assert list(first) == ["shoes", "sale"] and (second is None or len(second) == 0)  # an empty field: no tags
