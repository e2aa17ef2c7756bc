"""Progress bars: drawn for a person at a terminal, silent in logs, workers and CI."""

import io

from rich.console import Console

from storage.io.progress import Bar, wanted


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_terminal_means_no_bar_and_no_output(capsys):
    with Bar("training steps", total=10) as bar:
        bar.update(5)
        bar.advance()
    assert not bar.enabled
    assert capsys.readouterr() == ("", "")


def test_a_terminal_gets_a_bar_with_counts():
    out = io.StringIO()
    with Bar("backfill dates", total=5, console=Console(file=out, force_terminal=True, width=100)) as bar:
        bar.update(3)
    assert bar.enabled
    assert "backfill dates" in out.getvalue() and "3/5" in out.getvalue()


def test_bars_can_be_switched_off_even_at_a_terminal(monkeypatch):
    assert wanted(_Tty())
    monkeypatch.setenv("CTRPIPE_PROGRESS", "off")
    assert not wanted(_Tty())
