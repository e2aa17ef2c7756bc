"""The error of an ingest that cannot commit, raised by the stage and by its per-file tasks."""

from __future__ import annotations


class IngestError(RuntimeError):
    """The date cannot be ingested as it stands; nothing was committed.

    `kind` is one of "corrupt_input" (a compressed file is truncated or corrupt),
    "too_many_bad_rows" (quarantined share over ingest.max_bad_fraction),
    "no_rows" (the inputs hold no valid row of the date) and "inconsistent"
    (a committed quarantine does not belong to the committed events run).
    """

    def __init__(self, message: str, *, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):  # keep `kind` when Dask ships the error from a worker
        return (_make_ingest_error, (str(self), self.kind))


def _make_ingest_error(message: str, kind: str) -> IngestError:
    return IngestError(message, kind=kind)
