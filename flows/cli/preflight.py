"""What a run needs beyond a valid config, checked before Prefect or Dask start (seconds, not minutes).

`ctrpipe run`, `backfill` and `demo` call `check_before_start` after loading the config: an input URL that
cannot tell the dates apart, or a root (or node-local folder) this user cannot write, would otherwise fail
only at the stage that meets it, after the temporary Prefect server and the Dask cluster started.  The
error names the key and the fix; `ctrpipe` exits with `ExitCode.FAILED`, as for any config error.
`run` and `backfill` then call `check_inputs` for the dates they will run: each has an input file (unless
`input.wait_s` waits for it) and the first file's first lines fit the schema (`pipeline.ingest.sample`).

`dates_done` decides, from the day records alone, whether a run has anything to do.
"""

from __future__ import annotations

import errno
import uuid
from typing import Any

from storage.io import fsio


def check_before_start(cfg: Any) -> None:
    """Raise ValueError naming the key and the fix for what would fail a run of `cfg` later on.

    Args:
        cfg: the run's `flows.config.RunConfig`.
    """
    from pipeline.ingest.stage import check_input_url

    check_input_url(cfg.input)
    layout = cfg.layout()
    check_writable(layout.root, key="root")
    if cfg.store.local_dir:
        check_writable(layout.local_dir, key="store.local_dir")


def check_inputs(cfg: Any, dates: list[str], *, force: bool = False) -> None:
    """Each date to run (not completed, or every one with `force`) has its input, and its lines fit the schema.

    Raises:
        FileNotFoundError: a date's input URL matches no file and `input.wait_s` is 0 (the message names the URL).
        ValueError: most of a sample's lines would be quarantined (the reasons, a line each, and the fix).
    """
    from flows.day.record import read_record
    from pipeline.ingest.sample import check_inputs as check_input_files
    from pipeline.ingest.stage import find_inputs, input_url

    layout = cfg.layout()
    todo = [d for d in dates if force or not ((r := read_record(layout, d)) and r.completed)]
    urls = {d: input_url(cfg.input, layout, d) for d in todo}
    check_input_files(cfg.input, urls, find=lambda url: find_inputs(url, cfg.input.storage_options))


def check_writable(url: str, *, key: str) -> None:
    """Make the local folder `url` (a config's `key`) and write a file in it; object stores are not checked here.

    Raises:
        ValueError: it cannot be made or written, naming `key` and what to do.
    """
    if not fsio.is_local(url):
        return
    folder = fsio.local_path(url)
    probe = folder / f".ctrpipe-write-check-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.EROFS, errno.EPERM, errno.EACCES):
            why += " (a read-only filesystem, or a folder this user may not write)"
        raise ValueError(
            f"{key} {str(folder)!r} is not writable: {why}; set {key} to a folder this user can write "
            f"(--set {key}=DIR or `{key}:` in the config file)"
        ) from exc


def dates_done(layout: Any, dates: list[str]) -> list[Any] | None:
    """The day records of `dates` when every one of them is completed, else None (the run has work to do)."""
    from flows.day.record import read_record

    records = []
    for date in dates:
        record = read_record(layout, date)
        if record is None or not record.completed:
            return None
        records.append(record)
    return records
