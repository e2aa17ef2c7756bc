"""`ctrpipe check-schema`: a schema read against an input file's first lines without a run (issue 52): the rows in
numbers, one line per column, the problems in ingest's words, exit 1 when the schema does not fit them."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.exit_codes import ExitCode
from tests.helpers.in_process import isolated

SCHEMA = """name: talk
separator: ","
header: true
columns: [ip, app, click_time, attributed_time, is_attributed]
label: is_attributed
categorical: [app]
timestamp: {{column: click_time, format: "{fmt}"}}
time_features: [hour_of_day, day_of_week]
"""


def check_schema(tmp: Path, capfd, *args: str) -> tuple[int, str, str]:
    from flows.cli.main import main

    capfd.readouterr()
    with isolated(tmp):
        code = main(["check-schema", "--preset", "demo", "--set", f"root={tmp / 'root'}", *args])
    out = capfd.readouterr()
    return code, out.out, out.err


def files(tmp: Path, fmt: str) -> list[str]:
    """Two days of clicks in one file named by neither, and the options that point input.url and format at them."""
    rows = ["ip,app,click_time,attributed_time,is_attributed"]
    for d in ("2026-03-11", "2026-03-12"):
        rows += [f"{i},a{i % 4},{d} {i % 24:02d}:00:00,,{int(i % 10 == 0)}" for i in range(50)]
    (tmp / "clicks.csv").write_text("\n".join(rows) + "\n")
    (tmp / "talk.yaml").write_text(SCHEMA.format(fmt=fmt))
    return ["--set", f"input.url={tmp}/clicks.csv", "--set", f"input.format={tmp}/talk.yaml"]


def test_a_fitting_schema_prints_the_counts_and_every_column(tmp_path, capfd):
    code, out, err = check_schema(tmp_path, capfd, *files(tmp_path, "%Y-%m-%d %H:%M:%S"), "--date", "2026-03-12")
    assert code == ExitCode.OK, err
    assert "100 rows read = 50 valid + 0 quarantined + 50 dated elsewhere" in out
    table = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith(("ip ", "app ", "click"))}
    assert table == {"ip": "dropped", "app": "categorical", "click_time": "timestamp"}
    assert "read as 2026-03-11 00:00:00 .. 2026-03-12 23:00:00, 2 dates" in out
    assert "10.00% positive" in out and "day_of_week" in out and "no problems found" in out


def test_a_wrong_time_pattern_shows_the_reason_and_fails(tmp_path, capfd):
    code, out, _ = check_schema(tmp_path, capfd, *files(tmp_path, "%d/%m/%Y %H:%M"), "--lines", "20")
    assert code == ExitCode.FAILED
    assert "19 rows read = 0 valid + 19 quarantined (100.00%) + 0 dated elsewhere" in out  # the header is line 1
    assert "the schema does not fit these lines:" in out and "bad timestamp x19, e.g. " in out
    assert "fix timestamp.format in the schema file" in out


def test_no_file_to_read_is_an_error_naming_the_url(tmp_path, capfd):
    code, _, err = check_schema(tmp_path, capfd, "--set", f"input.url={tmp_path}/day_{{date}}.csv")
    assert code == ExitCode.FAILED and f"no file matches {tmp_path}/day_*.csv" in err, err


def test_check_schema_explains_itself_and_every_option():
    from flows.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices["check-schema"]
    assert "examples:\n  ctrpipe check-schema" in p.format_help() and len(p.description or "") > 60
    assert all(a.help for a in p._actions if a.option_strings), [a.dest for a in p._actions if not a.help]
