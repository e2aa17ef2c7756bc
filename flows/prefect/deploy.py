"""Prefect deployments of the flows, per model: `<model>-daily` (cron), `<model>-on-demand`, `<model>-backfill`.

    ctrpipe deploy [--pool ctr-process] [--config FILE] [--cron "0 2 * * *"] [--no-alerts]  # a worker runs them
    ctrpipe serve  [--config FILE] [--cron ...]                                  # one process, no work pool

Deployment names carry the model's name, so several models share one Prefect
server: deploying one leaves the others' deployments, schedules and
automations in place.  Deploy also creates the model's alert automations
(`flows.prefect.alerts`).  The daily deployment passes no date: the flow computes the
day before the run's *scheduled* start time, so a late run still processes
the right day.
Deployments reference the code by its folder (a process work pool on one
machine) or by the image's working directory (the `ctr-k8s` Kubernetes pool,
see infra/); `infra/prefect.yaml` describes the same deployments for
`prefect deploy --all`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DAILY_ENTRY = "flows/prefect/daily.py:daily_retrain"
BACKFILL_ENTRY = "flows/prefect/daily.py:backfill"
DEFAULT_POOL = "ctr-process"
DEFAULT_CRON = "0 2 * * *"


def ensure_process_pool(name: str) -> None:
    """Create a process work pool named `name` if the server has none."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def deployment_names(model_name: str) -> dict[str, str]:
    """kind -> the model's deployment name (`daily-retrain/<model>-daily`, ...)."""
    return {kind: f"{model_name}-{kind}" for kind in ("daily", "on-demand", "backfill")}


def deploy_all(
    config: dict[str, Any],
    *,
    pool: str = DEFAULT_POOL,
    cron: str = DEFAULT_CRON,
    timezone: str = "UTC",
    source: str | Path = REPO,
    alerts: bool = True,
) -> dict[str, str]:
    """Register the model's three deployments (and its automations) on the server at PREFECT_API_URL.

    Returns:
        deployment (or automation) name -> id.
    """
    from prefect import flow
    from prefect.schedules import Cron

    from flows.config import from_dict
    from flows.prefect.alerts import AlertsConfig, upsert_automations
    from flows.prefect.slot import ensure_limit
    from storage.io import codec

    model = config.get("model_name", "ctr")
    names = deployment_names(model)
    ensure_limit(from_dict(config).layout())
    # Prefect's sync/async methods are typed `X | Coroutine[X]`; called from sync code they return X.
    daily: Any = flow.from_source(source=str(source), entrypoint=DAILY_ENTRY)
    backfill: Any = flow.from_source(source=str(source), entrypoint=BACKFILL_ENTRY)
    # ignore_warnings: Prefect's advice to `.serve` instead of a process pool, printed per deployment (`serve` exists)
    common: dict[str, Any] = {"work_pool_name": pool, "build": False, "push": False, "print_next_steps": False,
              "ignore_warnings": True}
    tags = ["ctr-pipeline", f"model:{model}"]
    ids = {
        names["daily"]: daily.deploy(
            name=names["daily"], schedules=[Cron(cron, timezone=timezone)], parameters={"config": config},
            description=f"Scheduled daily retrain of model {model}: the day before the scheduled time.", tags=tags,
            **common,
        ),
        names["on-demand"]: daily.deploy(
            name=names["on-demand"], parameters={"config": config},
            description=f"Retrain model {model} on one date now: --param date=YYYY-MM-DD [--param overrides='{{...}}'].",
            tags=tags, **common,
        ),
        names["backfill"]: backfill.deploy(
            name=names["backfill"], parameters={"config": config},
            description=f"Retrain model {model} on a date range in order: --param start=... --param end=...; resumable.",
            tags=tags, **common,
        ),
    }
    out = {k: str(v) for k, v in ids.items()}
    if alerts:
        cfg = codec.decode(AlertsConfig, config.get("alerts"), prefix="alerts.")
        out.update(upsert_automations(model, out[names["daily"]], cfg))
    return out


def serve_all(config: dict[str, Any], *, cron: str = DEFAULT_CRON, timezone: str = "UTC") -> None:
    """Serve the three deployments from this process (the single-process alternative to a worker)."""
    from prefect import serve
    from prefect.schedules import Cron

    from flows.config import from_dict
    from flows.prefect.daily import backfill, daily_retrain
    from flows.prefect.slot import ensure_limit, server_configured

    model = config.get("model_name", "ctr")
    names = deployment_names(model)
    if server_configured():
        ensure_limit(from_dict(config).layout())
    tags = ["ctr-pipeline", f"model:{model}"]
    # to_deployment is typed `X | Coroutine[X]` (Prefect's sync/async methods); called from sync code it returns X
    deployments: list[Any] = [
        daily_retrain.to_deployment(name=names["daily"], schedules=[Cron(cron, timezone=timezone)],
                                    parameters={"config": config}, tags=tags),
        daily_retrain.to_deployment(name=names["on-demand"], parameters={"config": config}, tags=tags),
        backfill.to_deployment(name=names["backfill"], parameters={"config": config}, tags=tags),
    ]
    serve(*deployments)
