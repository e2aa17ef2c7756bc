"""Modules a later stage will import, loaded while the run only waits: `preloaded(names)` around the wait.

The train stage waits on its job (`trainer.launch.torchrun.run_training`: another process trains, this one
relays its output), and the publish stage's first `torch.export` of a process imports `torch._dynamo` and
`torch.export`'s tracer first (`trainer.export.FIRST_EXPORT_IMPORTS`): about a second and a half of CPU that
the first model's publish paid on top of its export.  Loaded in a thread during the wait, on a core the
job leaves free (one rank trains on one thread), they are there when publish asks.  Nothing else changes:
the same modules, imported once per process either way.

The thread is joined before the block is left, so no other import of this process runs beside it afterwards;
a module that fails to load is left to the stage that needs it, which imports it again and says why.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def preloaded(names: Sequence[str]) -> Iterator[None]:
    """For the block, import the modules `names` not yet imported, in order, in a thread; joined on the way out."""
    missing = [n for n in names if n not in sys.modules]
    if not missing:
        yield
        return
    thread = threading.Thread(target=_load, args=(missing,), name="preload", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _load(names: Sequence[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - its stage imports it again and raises there
            log.debug("preloading %s failed: %s", name, exc)
            return
