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
        from flows.serving.export import bundle_sizes

        version = reg.resolve(args.version)
        info = reg.info(version)
        print(
            json.dumps(
                {
                    "version": info.version,
                    "status": info.status,
                    "reason": info.reason,
                    "created": info.created,
                    "metrics": info.metrics,
                    "bytes": reg.version_bytes(version),
                    "bundle": bundle_sizes(reg.layout, version),
                    "lineage": reg.read_json(version, "lineage.json"),
                },
                indent=2,
                default=str,
            )
        )
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
