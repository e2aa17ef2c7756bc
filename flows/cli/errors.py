"""How a failed command reads to the user: one short message (`describe`) and the error of a failed run.

Our messages say what to do, so the type name shows only where it helps; a long message (a trainer's
output tail) keeps its first line and its last lines.
"""

from __future__ import annotations

MAX_ERROR_LINES = 8
"""A longer error message (a trainer's output tail) keeps its first line and its last lines."""


class RunFailed(RuntimeError):
    """A daily run (or a backfill) ended in a failed state; the message says where and why."""


def describe(exc: BaseException) -> str:
    """The error as the user reads it: our messages say what to do, so the type name only where it helps."""
    text = str(exc).strip()
    if not isinstance(exc, ValueError | OSError | RuntimeError) or not text:
        text = f"{type(exc).__name__}: {text}".rstrip(": ")
    lines = text.splitlines()
    if len(lines) > MAX_ERROR_LINES:
        lines = [lines[0], "  ...", *lines[-(MAX_ERROR_LINES - 2) :]]
    return "\n".join(lines)
