"""The exit codes: each has a meaning, and `ctrpipe --help` lists every one."""

from flows.cli.exit_codes import MEANINGS, ExitCode, help_text


def test_every_code_has_a_meaning_in_the_help_text():
    text = help_text()
    assert set(MEANINGS) == set(ExitCode)
    for code in ExitCode:
        assert f"  {int(code):<4} {MEANINGS[code]}" in text


def test_the_documented_codes_keep_their_numbers():
    assert (ExitCode.OK, ExitCode.FAILED, ExitCode.REFUSED, ExitCode.USAGE) == (0, 1, 2, 64)
