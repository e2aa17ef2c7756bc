"""`ctrpipe models`: list, show, roll back or prune the versions of the model registry."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flows.cli.arguments import load_config_of
from flows.cli.exit_codes import ExitCode


def cmd_models(args: argparse.Namespace) -> int:
    from storage.io.registry import ModelRegistry

    cfg = load_config_of(args)
    reg = ModelRegistry(cfg.layout())
    if args.action == "list":
        versions = reg.versions()
        if not versions:
            print(
                f"no versions of model {cfg.model_name} under {cfg.layout().models()} (the config's root); "
                "point elsewhere with --config FILE, --set root=DIR, or --preset demo for ./demo-data",
                file=sys.stderr,
            )
            return ExitCode.OK
        latest = reg.latest()
        for v in versions:
            info = reg.info(v)
            mark = "*" if v == latest else " "
            auc = info.metrics.get("auc")
            print(
                f"{mark} {v}  {info.status:<9} {info.metrics.get('date', ''):<10} "
                f"auc={'-' if auc is None else f'{auc:.4f}'}  bytes={reg.version_bytes(v)}  "
                f"bundle={reg.bundle_bytes(v)}  {info.reason}".rstrip()
            )
        return ExitCode.OK
    if args.action == "prune":
        return _models_prune(reg, cfg, dry_run=args.dry_run)
    if not args.version:
        raise ValueError(
            f"models {args.action} needs a VERSION (v00003, latest or previous); see `ctrpipe models list`"
        )
    if args.action == "show":
        shown = _shown(reg, reg.resolve(args.version))
        print(json.dumps(shown, indent=2, default=str) if args.json else "\n".join(_summary(shown)))
        return ExitCode.OK
    before = reg.latest()
    version = reg.resolve(args.version)
    reg.rollback(version)
    print(f"LATEST -> {version}" + ("" if before in (None, version) else f" (was {before})"))
    from flows.serving.export import ExportError, point_servers_at

    try:
        point_servers_at(reg.layout, version)
        print(f"servers -> {version} (bundles/{reg.model_name}/LATEST)")
    except ExportError as exc:
        print(f"servers not moved: {exc}", file=sys.stderr)
    return ExitCode.OK


def _shown(reg: Any, version: str) -> dict[str, Any]:
    """Everything `models show` knows of `version`: its status, metrics and gate, sizes, lineage (with the run's
    config), and `pins`, the shape keys a next day keeps unless its config sets them (value and where it came from:
    model.json `config_sources`, `-` for a model from before they were recorded)."""
    from flows.config import lineage_values
    from flows.serving.export import bundle_sizes
    from trainer.model_dir import read_meta

    info = reg.info(version)
    meta = read_meta(reg.url(version), reg.layout.storage_options)
    return {
        "version": info.version,
        "status": info.status,
        "reason": info.reason,
        "created": info.created,
        "metrics": info.metrics,
        "bytes": reg.version_bytes(version),
        "bundle": bundle_sizes(reg.layout, version),
        "init_model_url": meta.init_model_url,
        "pins": {k: {"value": v, "source": meta.config_sources.get(k, "-")} for k, v in lineage_values(meta).items()},
        "lineage": reg.read_json(version, "lineage.json"),
    }


def _summary(shown: dict[str, Any]) -> list[str]:
    """A screen of `_shown`: what a user checks of a version (`--json` prints everything)."""
    m, lineage, bundle = shown["metrics"], shown["lineage"] or {}, shown["bundle"] or {}
    auc, before = m.get("auc"), m.get("published_auc_same_rows")
    lines = [
        f"{shown['version']}  {shown['status']}  date {m.get('date') or lineage.get('date', '-')}  "
        f"created {shown['created']}" + (f"  ({shown['reason']})" if shown["reason"] else ""),
        f"  metrics   AUC {_num(auc)}  logloss {_num(m.get('logloss'))}  calibration {_num(m.get('calibration'))}"
        f"  on {m.get('rows', '-')} eval rows" + (f"; the published model {_num(before)} on them" if before else ""),
    ]
    gate = m.get("gate") or []
    refused = [f"{c['name']} ({c.get('detail', '')})" for c in gate if not c.get("passed") and not c.get("undecided")]
    undecided = [f"{c['name']} ({c.get('detail', '')})" for c in gate if c.get("undecided")]
    lines.append(
        f"  gate      {len(gate) - len(refused) - len(undecided)} of {len(gate)} checks passed"
        + _refused(refused)
        + ("; undecided: " + ", ".join(undecided) if undecided else "")
    )
    lines.append(
        f"  lineage   parent {lineage.get('parent_version') or '-'}, run tag {lineage.get('run_tag', '-')}, "
        f"code {lineage.get('code_version', '-')}; dense part from "
        + (shown["init_model_url"].rstrip("/").rsplit("/", 1)[-1] if shown["init_model_url"] else "scratch (cold)")
    )
    lines.append(
        f"  size      {shown['bytes']:,} bytes; bundle {bundle.get('full_bytes', 0):,} bytes, "
        f"{bundle.get('rows', 0):,} rows ({bundle.get('dtype', '-')}), {len(bundle.get('deltas') or [])} delta(s)"
    )
    pins = [
        f"{k}={_value(p['value'])}" + ("" if p["source"] == "-" else f" ({p['source']})")
        for k, p in shown["pins"].items()
    ]
    lines.append("  pins      (a next day keeps these unless its config sets them; set: the config, lineage: the")
    lines.append("            model it started from, default: the preset's or the code's)")
    row = "           "
    for pin in pins:
        if len(row) + len(pin) + 1 > 118:
            lines.append(row)
            row = "           "
        row += f" {pin}"
    lines += [row, "  (--json prints everything: metrics, gate checks, lineage and the run's config)"]
    return lines


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def _value(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")).strip('"')


def _refused(refused: list[str]) -> str:
    return "; refused by " + ", ".join(refused) if refused else ""


def _models_prune(reg: Any, cfg: Any, *, dry_run: bool) -> int:
    plan = reg.prune(cfg.registry, dry_run=dry_run)
    for v, why in plan.keep.items():
        print(f"keep    {v}  {why}")
    for v in plan.delete:
        print(f"{'would delete' if dry_run else 'deleted'} {v}")
    for d in plan.delete_deltas:
        print(f"{'would delete' if dry_run else 'deleted'} delta {d}")
    print(f"{plan.freed_bytes} bytes {'would be ' if dry_run else ''}freed")
    return ExitCode.OK
