"""Prefect deployments of the flows: `daily` (cron), `on-demand`, `backfill`.

    ctrpipe deploy [--pool ctr-process] [--config FILE] [--cron "0 2 * * *"]   # a worker then runs them
    ctrpipe serve  [--config FILE] [--cron ...]                                  # one process, no work pool

The `daily` deployment passes no date: the flow computes the day before the
run's *scheduled* start time, so a late run still processes the right day.
Deployments reference the code by its folder (a process work pool on one
machine) or by the image's working directory (the `ctr-k8s` Kubernetes pool,
see infra/); `infra/prefect.yaml` describes the same deployments for
`prefect deploy --all`.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DAILY_ENTRY = "flows/daily.py:daily_retrain"
BACKFILL_ENTRY = "flows/daily.py:backfill"
DEFAULT_POOL = "ctr-process"
DEFAULT_CRON = "0 2 * * *"


def ensure_process_pool(name: str) -> None:
    """Create a process work pool named `name` if the server has none."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client, suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def deploy_all(
    config: dict[str, Any],
    *,
    pool: str = DEFAULT_POOL,
    cron: str = DEFAULT_CRON,
    timezone: str = "UTC",
    source: str | Path = REPO,
) -> dict[str, str]:
    """Register the three deployments on the server at PREFECT_API_URL; returns name -> deployment id."""
    from prefect import flow
    from prefect.schedules import Cron

    from flows.config import from_dict
    from flows.prefect_slot import ensure_limit

    ensure_limit(from_dict(config).layout())
    daily = flow.from_source(source=str(source), entrypoint=DAILY_ENTRY)
    backfill = flow.from_source(source=str(source), entrypoint=BACKFILL_ENTRY)
    common = {"work_pool_name": pool, "build": False, "push": False, "print_next_steps": False}
    tags = ["ctr-pipeline", f"model:{config.get('model_name', 'ctr')}"]
    ids = {
        "daily": daily.deploy(
            name="daily", schedules=[Cron(cron, timezone=timezone)], parameters={"config": config},
            description="Scheduled daily retrain of the day before the scheduled time.", tags=tags, **common,
        ),
        "on-demand": daily.deploy(
            name="on-demand", parameters={"config": config},
            description="Retrain one date now: --param date=YYYY-MM-DD [--param overrides='{...}'].",
            tags=tags, **common,
        ),
        "backfill": backfill.deploy(
            name="backfill", parameters={"config": config},
            description="Retrain a date range in order: --param start=... --param end=...; resumable.",
            tags=tags, **common,
        ),
    }
    return {k: str(v) for k, v in ids.items()}


def serve_all(config: dict[str, Any], *, cron: str = DEFAULT_CRON, timezone: str = "UTC") -> None:
    """Serve the three deployments from this process (the single-process alternative to a worker)."""
    from prefect import serve
    from prefect.schedules import Cron

    from flows.config import from_dict
    from flows.daily import backfill, daily_retrain
    from flows.prefect_slot import ensure_limit, server_configured

    if server_configured():
        ensure_limit(from_dict(config).layout())
    serve(
        daily_retrain.to_deployment(name="daily", schedules=[Cron(cron, timezone=timezone)],
                                    parameters={"config": config}),
        daily_retrain.to_deployment(name="on-demand", parameters={"config": config}),
        backfill.to_deployment(name="backfill", parameters={"config": config}),
    )
