"""The exit codes of `ctrpipe`, in one place: the CLI returns them, `ctrpipe --help` and docs/user-guide.md list them.

Scripts and schedulers branch on these, so a code keeps its meaning once released; new outcomes get
new numbers (3..63 are free for them).  A command line argparse cannot understand exits with USAGE
rather than argparse's 2, which here means that the publish gate refused a model.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    REFUSED = 2
    USAGE = 64
    INTERRUPTED = 130
    BROKEN_PIPE = 141


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done (score-server: stopped by SIGTERM after answering the requests in flight)",
    ExitCode.FAILED: "failed: the error line says what failed and what to do",
    ExitCode.REFUSED: "refused: a guard said no (the publish gate kept LATEST, or a data check stopped the day)",
    ExitCode.USAGE: "the command line was not understood (unknown option, missing or bad argument)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C; SIGTERM to any command but score-server): one line says what was "
    "interrupted and how to resume",
    ExitCode.BROKEN_PIPE: "the reader of the output went away (`ctrpipe ... | head`); nothing is reported",
}


def help_text() -> str:
    """The exit-code table of `ctrpipe --help`."""
    return "exit codes:\n" + "\n".join(f"  {int(code):<4} {MEANINGS[code]}" for code in ExitCode)
