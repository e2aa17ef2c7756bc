"""The chaos suite's trials: a workspace, an uninterrupted reference, a killed run and its rerun, the checks
of the rerun against the reference, and the closing table (tests/chaos, `make chaos`)."""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections import Counter
from pathlib import Path

from tests.helpers.kill import OUTLIVE_S, STAGES, Run, run, run_and_kill, stage_at_kill

DATE = "2026-04-01"
"""The date of the one-day trials (the whole Criteo sample)."""
VARIANT_TRIALS = int(os.environ.get("CHAOS_VARIANT_TRIALS", "2"))
"""Trials of each of the backfill, two-rank and S3 variants."""


def kill_time(seed: int, variant: str, trial: int, lo: float, hi: float) -> float:
    """The kill moment of one trial, reproducible from the seed (printed with it)."""
    return round(random.Random(f"{seed}:{variant}:{trial}").uniform(lo, hi), 2)


@dataclasses.dataclass
class VariantReport:
    """One row of the closing table."""

    trials: int = 0
    kills: Counter = dataclasses.field(default_factory=Counter)
    matching: int = 0
    longest_wait_s: float = 0.0
    outlived: int = 0
    """Trials whose kill of the process group left part of the run alive after `OUTLIVE_S` (a failure)."""

    def add(self, stage: str, matched: bool, waited_s: float, survivors: tuple[str, ...] = ()) -> None:
        self.trials += 1
        self.kills[stage] += 1
        self.matching += matched
        self.longest_wait_s = max(self.longest_wait_s, waited_s)
        self.outlived += bool(survivors)


def table(seed: int, reports: dict[str, VariantReport]) -> str:
    """The closing note: trials, kill points by stage, reruns matching, longest rerun wait."""
    head = ("variant", "trials", "kill points by stage", "reruns matching", "longest rerun wait", "torchrun outlived")
    rows = [head] + [
        (
            name,
            str(r.trials),
            ", ".join(f"{k} {n}" for k, n in sorted(r.kills.items(), key=_stage_order)),
            f"{r.matching}/{r.trials}",
            f"{r.longest_wait_s:.1f}s",
            str(r.outlived),
        )
        for name, r in reports.items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return f"chaos seed {seed} (replay: CHAOS_SEED={seed} make chaos)\n" + "\n".join(lines)


def _stage_order(item: tuple[str, int]) -> tuple[str, int]:
    name = item[0]
    order = ("startup", *STAGES, "record", "done")
    stage = name.rsplit(" ", 1)[-1]
    return (name.split(" ")[0] if " " in name else "", order.index(stage) if stage in order else len(order))


# ---- a workspace of trials and the checks of a rerun ------------------------------------------------
CONFIG = {
    "input": {"format": "criteo"},
    "dask": {"n_workers": 1},
    "vocab": {"min_count": 2},
    "store": {"embedding_dim": 8, "host_budget_mb": 64},
    "model": {"mlp_dims": [32, 16]},
    "optim": {"batch_size": 256, "k_steps": 5},
    "publish": {"max_auc_drop": 0.05, "min_eval_rows": 50},
}
BAD_LINES = b"1\tnot-a-number\n" + b"7" + b"\t1" * 13 + b"\tabc" * 26 + b"\n"
"""Two malformed lines appended to each day, so that every trial also checks the quarantine."""


def write_days(sample: Path, raw: Path, days: list[str], bad_lines: bytes = BAD_LINES) -> None:
    """`raw/day_D.tsv` for each of `days`: the sample's lines split evenly, `bad_lines` after each."""
    lines = sample.read_bytes().splitlines(keepends=True)
    raw.mkdir(parents=True, exist_ok=True)
    n = len(lines) // len(days)
    for i, d in enumerate(days):
        (raw / f"day_{d}.tsv").write_bytes(b"".join(lines[i * n : (i + 1) * n]) + bad_lines)


def write_config(path: Path, root: str, raw: Path, **sections: dict) -> Path:
    """A YAML config of `CONFIG` for `root`, with `sections` merged over it."""
    import yaml

    data = {**CONFIG, "root": root, "input": {**CONFIG["input"], "url": str(raw / "day_{date}.tsv")}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    path.write_text(yaml.safe_dump(data))
    return path


@dataclasses.dataclass(frozen=True)
class Reference:
    """An uninterrupted run: how long it took and what it left."""

    run: Run
    days: dict  # date -> root_state.DayOutputs
    chain: list


def reference(args: list[str], env: dict[str, str], log: Path, layout, dates: list[str], timeout: float) -> Reference:
    from tests.helpers import root_state

    ref = run(args, env, log, timeout=timeout)
    if ref.rc != 0:
        raise AssertionError(f"the reference run failed ({ref.rc}); see {log}:\n{ref.text()[-3000:]}")
    problems = root_state.registry_problems(layout, dates) + root_state.leftovers(layout)
    if problems:
        raise AssertionError(f"the reference run itself left {problems}")
    return Reference(ref, {d: root_state.day_outputs(layout, d) for d in dates}, root_state.chain(layout))


def slot_wait(layout, dates: list[str]) -> float:
    """The longest time a run of `dates` waited for the model's slot, from the days' records."""
    from flows.day.record import read_record

    return max((r.slot_wait_s for d in dates if (r := read_record(layout, d))), default=0.0)


def rerun_problems(ref: Reference, rerun: Run, layout, dates: list[str], *, max_wait_s: float = 1.0) -> list[str]:
    """Everything a rerun after a kill must satisfy, against the uninterrupted reference; empty when it does."""
    from tests.helpers import root_state

    if rerun.rc != 0:
        return [f"the rerun exited with {rerun.rc}: {rerun.text()[-2000:]}"]
    problems = []
    for d in dates:
        problems += [f"{d} {p}" for p in root_state.differences(ref.days[d], root_state.day_outputs(layout, d))]
    problems += root_state.registry_problems(layout, dates)
    if (got := root_state.chain(layout)) != ref.chain:
        problems.append(f"registry versions {got} != the reference's {ref.chain}")
    problems += [f"leftover {p}" for p in root_state.leftovers(layout)]
    waited = slot_wait(layout, dates)
    if waited > max_wait_s:
        problems.append(f"the rerun waited {waited:.1f}s for the model's slot")
    if max_wait_s < 60 and "waiting for" in rerun.text():
        problems.append("the rerun logged that it was waiting for the slot")
    return problems


@dataclasses.dataclass(frozen=True)
class Workspace:
    """Where one variant's trials live, the raw input they read, and the environment they run in."""

    base: Path
    raw: Path
    env: dict[str, str]

    def config(self, name: str, root: str | None = None, **sections: dict) -> Path:
        """`<base>/<name>.yaml` for the root `<base>/<name>` (or `root`)."""
        return write_config(self.base / f"{name}.yaml", root or str(self.base / name), self.raw, **sections)


def workspace(workdir: Path, name: str, sample: Path, days: list[str], env: dict[str, str]) -> Workspace:
    base = workdir / name
    write_days(sample, base / "raw", days)
    return Workspace(base, base / "raw", env)


def kill_and_rerun(
    ws: Workspace,
    variant: str,
    trial: int,
    args: list[str],
    layout,
    dates: list[str],
    ref: Reference,
    *,
    kill_at: float,
    seed: int,
    reports: dict[str, VariantReport],
    after: str = "",
) -> list[str]:
    """One trial: `ctrpipe args` killed after `kill_at` s (from the start, or from the message `after`), rerun to
    the end, checked against `ref` and reported."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", variant).strip("-") + f"-{trial}"
    killed = run_and_kill(args, ws.env, ws.base / f"{name}-killed.log", after_s=kill_at, after=after)
    stage = stage_at_kill(killed, dates)
    rerun = run(args, ws.env, ws.base / f"{name}-rerun.log", timeout=3 * ref.run.seconds + 120)
    problems = rerun_problems(ref, rerun, layout, dates)
    if killed.survivors:  # the job must end with its run (trainer.launch.lifetime), not train on beside the rerun
        problems = [*problems, f"outlived the kill by {OUTLIVE_S:g}s: {', '.join(killed.survivors)}"]
    reports.setdefault(variant, VariantReport()).add(stage, not problems, slot_wait(layout, dates), killed.survivors)
    when = f"{kill_at}s after {after!r}" if after else f"at {kill_at}s"
    print(
        f"\n{variant}, trial {trial}: killed {when} ({stage}; outlived: {killed.survivors or 'nothing'}), "
        f"rerun {rerun.seconds:.1f}s: {problems or 'ok'}  [CHAOS_SEED={seed}]"
    )
    return problems
