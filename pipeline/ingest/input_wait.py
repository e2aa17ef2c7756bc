"""Waiting for a day's input that lands late (a sensor, like PaddleRec's donefile or an Airflow sensor).

Upstream exports often finish after the scheduled run starts.  With `input.wait_s` > 0 the ingest
stage polls for the day's files (and, with `input.done_file`, for the marker the exporter writes
after the last file) instead of failing at once, logging once per poll what it still waits for.
The clock and the sleep are arguments, so the loop is tested without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pipeline.config import InputConfig
from storage.io.fsio import get_fs, join

log = logging.getLogger("ctrpipe")

Finder = Callable[[], list[dict[str, Any]]]


def done_marker_url(input_url: str, done_file: str) -> str:
    """The marker next to the day's files: `done_file` in the folder of `input_url` (a file or a glob)."""
    return join(input_url.rsplit("/", 1)[0] if "/" in input_url else ".", done_file)


def wait_for_input(
    find: Finder,
    *,
    url: str,
    date: str,
    input: InputConfig,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """The day's input fingerprints (`find()`), once they and the done marker are there.

    Args:
        find: lists the day's input files (an empty list while there are none).
        url: the day's input URL (for the marker's place and the messages).
        input: `wait_s`, `poll_s`, `done_file` and the storage options of the marker.

    Raises:
        FileNotFoundError: nothing (or no marker) after `input.wait_s`; the message says what was
            waited for and how long.
    """
    marker = done_marker_url(url, input.done_file) if input.done_file else None
    start = clock()
    while True:
        inputs = find()
        missing = _missing(inputs, marker, input.storage_options)
        if not missing:
            return inputs
        waited = clock() - start
        if waited >= input.wait_s:
            how_long = f" after waiting {waited:.0f}s (input.wait_s={input.wait_s:g})" if input.wait_s else ""
            raise FileNotFoundError(
                f"no input for {date} at {url}: {missing}{how_long}; check input.url, or set input.wait_s "
                "when the input lands late"
            )
        log.info("waiting for %s of %s (%.0fs of input.wait_s=%gs)", missing, date, waited, input.wait_s)
        sleep(max(0.0, min(input.poll_s, input.wait_s - waited)))


def _missing(inputs: list[dict[str, Any]], marker: str | None, storage_options: dict | None) -> str:
    """What is still missing, in words ("" when nothing is)."""
    if not inputs:
        return "no file matches the input URL" + (f" (nor is the done marker {marker} there)" if marker else "")
    if marker:
        fs, path = get_fs(marker, storage_options)
        fs.invalidate_cache()  # an object store's listing cache would hide a marker that just landed
        if not fs.exists(path):
            return f"the done marker {marker} is not there ({len(inputs)} file(s) are)"
    return ""
