"""`bench._proctree.ProcessTree`: a process is counted under the kind its command line names, also when the
first sample saw it before its exec, still with its parent's command line (a rank of a busy machine's run was
counted as `other`, and the run's rank peak read 0)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench._proctree import ProcessTree

# a child that is `python -c ...` for a while (its command line does not name trainer.main: the name is built), then
# execs itself into one that does
EXEC_LATER = (
    "import os, sys, time; time.sleep(1.0); "
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1.5)', 'trainer' + '.main'])"
)


@pytest.mark.subprocess
def test_a_process_seen_before_its_exec_is_counted_under_the_kind_it_becomes() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {EXEC_LATER!r}])"]
    )
    with ProcessTree(parent.pid, interval_s=0.2) as tree:
        parent.wait(timeout=60)
    kinds = tree.peak_rss_by_kind()
    assert kinds.get("rank", 0) > 0 and "other" not in kinds, kinds
    assert kinds.get("driver", 0) > 0
