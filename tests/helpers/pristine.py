"""A folder a module fixture builds once (a storage root after a few days), given to each test as it was built.

A test that changes the state it was given (reruns a day, moves LATEST, rolls a version back) would
otherwise leave it to the next test, which then passes or fails by the order they ran in.
`Pristine(path)` keeps a copy of `path` beside it; `restore()` puts that copy back in place, so each
test starts from the state the fixture built, whatever ran before it.

The copy goes back to the same path, not to the test's tmp_path: a day's run identity hashes absolute
paths under the root (its features, the model it starts from: `trainer.launch.spec.TrainSpec.identity`), so the
same state under another path would be another run to the pipeline, and a rerun would train again.
Copying a test-sized root takes well under a second.
"""

from __future__ import annotations

import shutil
from pathlib import Path


class Pristine:
    """The state of `path` now, to `restore()` before each test that uses it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.copy = self.path.with_name(self.path.name + ".pristine")
        shutil.copytree(self.path, self.copy, symlinks=True)

    def restore(self) -> Path:
        """Replace whatever is at `path` by the state it had when this was made; returns `path`."""
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.copytree(self.copy, self.path, symlinks=True)
        return self.path
