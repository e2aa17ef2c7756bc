"""Quarantined rows explained in words a user acts on: counts per reason, a sample line, the likely fix.

The ingest's quality check (`pipeline.ingest.totals.check_quality`) and `ctrpipe evaluate` both say why
rows were rejected with `explain`.  A share of bad rows this high (`MOSTLY_BAD`) is a schema mistake,
not dirty data, so the advice then points at the format rather than at `ingest.max_bad_fraction`.
Pure functions over the quarantine table and the reason counts; the sample of each reason is its first
quarantined line, taken where the rows are parsed (`tally`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from pipeline.ingest.parse import SEPARATORS, reason_category
from pipeline.schema import LogSchema

MOSTLY_BAD = 0.5
"""From this share of bad rows on, the rows and the format do not fit each other."""
SAMPLE_CHARS = 2000
"""A sample's raw line is kept up to this many characters (read for its separator, never printed)."""
TOP = 3


def tally(quarantine: pa.Table, counts: Counter, samples: dict[str, dict[str, Any]]) -> None:
    """Add `quarantine`'s reasons (by category) to `counts` and the first line of each new category to `samples`."""
    reasons = quarantine.column("reason").to_pylist()
    categories = [reason_category(r) for r in reasons]
    counts.update(categories)
    for i, category in enumerate(categories):
        if category not in samples:
            samples[category] = {
                "file": quarantine.column("file")[i].as_py(),
                "line": quarantine.column("line")[i].as_py(),
                "reason": reasons[i],
                "raw": (quarantine.column("raw")[i].as_py() or "")[:SAMPLE_CHARS],
            }


def merge_samples(into: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    """Keep the first sample of each category (callers merge in file order)."""
    for category, sample in new.items():
        into.setdefault(category, sample)


def describe_reasons(counts: dict[str, int], samples: dict[str, dict[str, Any]]) -> list[str]:
    """One line per top reason: `wrong field count x3000, e.g. FILE line 1: 5 fields, expected 14..40`."""
    lines = []
    for category, n in Counter(counts).most_common(TOP):
        sample = samples.get(category)
        where = ""
        if sample:
            detail = sample["reason"].split(":", 1)[1].strip() if ":" in sample["reason"] else ""
            where = f", e.g. {sample['file']} line {sample['line']}" + (f": {detail}" if detail else "")
        lines.append(f"{category} x{n}{where}")
    return lines


def advice(
    counts: dict[str, int],
    samples: dict[str, dict[str, Any]],
    *,
    share: float,
    schema: LogSchema,
    format_key: str,
    fmt: str,
    tolerance: str = "",
) -> str:
    """What to do about the bad rows.

    Args:
        share: bad rows / rows considered.
        format_key: the option or key that chose the format (`input.format`, `--format`), named in the advice.
        fmt: its value.
        tolerance: how to accept a few bad rows (e.g. "raise ingest.max_bad_fraction (now 0.01)"); empty: none.
    """
    if not counts:
        return ""
    if share < MOSTLY_BAD:
        accept = f", or {tolerance} to go on without them" if tolerance else ""
        return f"fix or remove the malformed rows{accept}"
    top = Counter(counts).most_common(1)[0][0]
    sample = samples.get(top, {})
    where = f"the schema file {fmt}" if fmt.lower().endswith((".yaml", ".yml")) else f"{format_key} ({fmt!r})"
    if top == "wrong field count":
        other = _fitting_separator(sample.get("raw", ""), schema)
        if other is not None:
            return (
                f"the lines split into the {schema.name} columns on {other!r}, not on {schema.separator!r}: "
                f"set separator: {other!r} in the schema file, or check {format_key} ({fmt!r})"
            )
        return f"the lines do not have the {schema.name} columns: check {where} and the file"
    if top == "bad timestamp":
        return f"{schema.timestamp} values do not read as {schema.timestamp_format!r}: fix timestamp.format in {where}"
    if top == "bad label":
        labels = "/".join((*schema.label_positive, *schema.label_negative))
        return f"the label column {schema.label!r} does not hold {labels}: check the label in {where}"
    if top.startswith("non-numeric"):
        return f"a column read as a number holds text: check the integer and float columns in {where}"
    if top == "undecodable bytes":
        return "the file is not UTF-8 text: is it compressed under a name without .gz or .bz2?"
    return f"most rows are bad: check {where} and the file"


def _fitting_separator(raw: str, schema: LogSchema) -> str | None:
    """Another separator on which the sample line has as many fields as the schema wants, if one does."""
    n = len(schema.columns)
    for sep in SEPARATORS:
        if sep != schema.separator and schema.required_fields <= len(raw.split(sep)) <= n:
            return sep
    return None
