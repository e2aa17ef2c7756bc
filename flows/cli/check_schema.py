"""`ctrpipe check-schema`: read the first lines of an input file with the config's schema, without a run.

Prints the rows in numbers (read = valid + quarantined + dated elsewhere), one line per column (its role, how
often it is filled, distinct values, the most common ones, and the label's positive share, the numbers' range
or the timestamps' span) and the problems found in ingest's words (`pipeline.ingest.sample`).  Exits 1 when the
schema does not fit the sample (the check a run makes before it starts), else 0.
"""

from __future__ import annotations

import argparse
import dataclasses

from flows.cli.arguments import at_least_one, load_config_of
from flows.cli.exit_codes import ExitCode


def cmd_check_schema(args: argparse.Namespace) -> int:
    from pipeline.ingest.sample import check_sample, read_sample
    from pipeline.schema import get_schema
    from storage.io.dates import validate_date

    at_least_one(lines=args.lines)
    if args.date:
        validate_date(args.date)
    cfg = load_config_of(args)
    fmt = args.format or cfg.input.format
    schema = get_schema(fmt)
    file = _sample_file(cfg, args.input, args.date)
    check = check_sample(
        read_sample(file, lines=args.lines, storage_options=cfg.input.storage_options),
        schema,
        file=file,
        date=args.date,
    )
    print(f"{schema.name} ({fmt}) on {file}, first {args.lines} lines:\n{check.counts()}\n")
    if check.columns:
        print(_table(check) + "\n")
    problems = check.problems(schema, fmt=fmt, format_key="--format" if args.format else "input.format")
    if not problems:
        print("no problems found")
    else:
        verdict = "the schema does not fit these lines" if not check.fits else "problems"
        print(f"{verdict}:\n" + "\n".join(f"  {p}" for p in problems))
    return ExitCode.OK if check.fits else ExitCode.FAILED


def _sample_file(cfg, url: str | None, date: str | None) -> str:
    """The file to sample: `--input`, else the first file of the date's input URL (any date's without --date)."""
    from pipeline.ingest.stage import find_inputs, input_url

    if not url:
        if date:
            url = input_url(cfg.input, cfg.layout(), date)
        else:
            any_date = dataclasses.replace(cfg.input, url=cfg.input.url.replace("{yyyymmdd}", "{date}"))
            url = input_url(any_date, cfg.layout(), "*")
    files = find_inputs(url, cfg.input.storage_options)
    if not files:
        raise FileNotFoundError(f"no file matches {url}: check input.url (or pass --input FILE)")
    return files[0]["url"]


def _table(check) -> str:
    width = max(len("column"), *(len(c.name) for c in check.columns))
    lines = [f"{'column':<{width}}  {'role':<12} {'filled':>7} {'distinct':>8}  values"]
    for c in check.columns:
        if c.role == "timestamp" and c.note and c.top:
            values = f"e.g. {c.top[0]}, read as {c.note}"
        else:
            values = ", ".join(c.top) + (f"  ({c.note})" if c.note else "")
        lines.append(f"{c.name:<{width}}  {c.role:<12} {c.filled:>7.1%} {c.distinct:>8}  {values}")
    return "\n".join(lines)
