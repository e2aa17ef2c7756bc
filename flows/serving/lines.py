"""Request lines with or without the label: what a server gets at request time is features only.

A line of the model's format carries the label column; a request-time log has no label.  The
schema says which column is the label, so a line is told apart by its field count:

    len(columns) fields         labelled (replay, parity checks): scored as it is
    len(columns) - 1 fields     features only: the label is written in (a negative, never used)
    other counts                refused, "wrong field count: ...", naming both counts it accepts

A format that strips trailing empty fields (Criteo's `min_fields`) also reads labelled lines of
`min_fields`..`len(columns)` fields, as ingest does.  A features-only line cut short the same way
cannot be told from a labelled one by its count: a request says `"labelled": false` (or `true`) and
every line of it is read that way.  The label written into a features-only line is the schema's
first negative label value, as `FeatureSpec.rows_to_lines` writes it for a row without one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.schema import LogSchema


def with_labels(
    lines: Sequence[str], schema: LogSchema, *, labelled: bool | None = None
) -> tuple[list[str | None], list[tuple[int, str]]]:
    """The lines as labelled lines of the format (None where refused), and (index, reason) of the refused ones.

    Args:
        lines: raw request lines.
        schema: the model's log format.
        labelled: None: by field count (see the module docstring); True: every line carries the label
            (ingest's rules apply as they are); False: no line does.
    """
    if labelled is True:
        return list(lines), []
    sep, ncols = schema.separator, len(schema.columns)
    at = schema.columns.index(schema.label)
    fill = schema.label_negative[0]
    least = schema.required_fields  # a labelled line's fewest fields
    out: list[str | None] = []
    errors: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        n = line.count(sep) + 1
        if "\n" in line or "\r" in line or not line.strip():
            out.append(line)  # the feature path refuses it with its own reason
        elif labelled is None and (n == ncols or least <= n < ncols - 1):
            out.append(line)
        elif n == ncols - 1 or labelled is False and least - 1 <= n < ncols - 1:
            out.append(_insert(line, sep, at, n, fill))
        else:
            out.append(None)
            errors.append((i, field_count_reason(n, schema, labelled)))
    return out, errors


def field_count_reason(n: int, schema: LogSchema, labelled: bool | None) -> str:
    """The reason a line of `n` fields is refused, naming the counts accepted (with and without the label)."""
    ncols, least = len(schema.columns), schema.required_fields
    with_label = f"{ncols}" if least == ncols else f"{least}..{ncols}"
    without = f"{ncols - 1}" if least == ncols or labelled is None else f"{least - 1}..{ncols - 1}"
    if labelled is False:
        return (
            f"wrong field count: {n} fields, expected {without} without the label column {schema.label!r} "
            '(the request says "labelled": false)'
        )
    return (
        f"wrong field count: {n} fields, expected {with_label} with the label column {schema.label!r} "
        f"or {without} without it"
    )


def _insert(line: str, sep: str, at: int, n: int, value: str) -> str:
    """`line` with `value` as its field number `at` (the fields from `at` on move one to the right)."""
    if at == 0:
        return f"{value}{sep}{line}"
    if at >= n:
        return line + sep * (at - n + 1) + value
    parts = line.split(sep, at)
    return sep.join([*parts[:at], value, parts[at]])
