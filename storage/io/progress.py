"""Progress bars for long CLI work that stay quiet when nobody is watching.

A bar is drawn only when stderr is a terminal (a person running `ctrpipe`);
under Prefect workers, CI and log files it does nothing, so logs stay clean.
`CTRPIPE_PROGRESS=off` turns bars off everywhere.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any


def wanted(stream: Any = None) -> bool:
    stream = stream if stream is not None else sys.stderr
    return os.environ.get("CTRPIPE_PROGRESS", "auto") != "off" and bool(getattr(stream, "isatty", lambda: False)())


class Bar:
    """`with Bar("training", total=n) as bar: bar.update(done)`; a no-op without a terminal."""

    def __init__(self, description: str, total: float | None = None, *, console: Any = None) -> None:
        self.description = description
        self._progress = None
        self._task = None
        if console is None and not wanted():
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total)

    @property
    def enabled(self) -> bool:
        return self._progress is not None

    def __enter__(self) -> Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def update(self, completed: float, *, total: float | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, total=total)

    def advance(self, n: float = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
