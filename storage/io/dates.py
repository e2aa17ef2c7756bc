"""Calendar dates as the pipeline spells them: YYYY-MM-DD, validated before they become paths."""

from __future__ import annotations

import datetime as _dt
import re

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def validate_date(value: str) -> str:
    """Return `value` if it is a real YYYY-MM-DD date; dates become paths, so nothing else is accepted."""
    if not isinstance(value, str) or not _DATE.match(value):
        raise ValueError(f"date must be YYYY-MM-DD, got {value!r}")
    try:
        _dt.date.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"date {value!r} is not a calendar date: {exc}") from exc
    return value


def date_range(start: str, end: str) -> list[str]:
    """Dates from start to end inclusive, in order."""
    a, b = _dt.date.fromisoformat(validate_date(start)), _dt.date.fromisoformat(validate_date(end))
    if b < a:
        raise ValueError(f"end date {end} is before start date {start}")
    return [(a + _dt.timedelta(days=i)).isoformat() for i in range((b - a).days + 1)]


def shift_date(date: str, days: int) -> str:
    return (_dt.date.fromisoformat(validate_date(date)) + _dt.timedelta(days=days)).isoformat()
