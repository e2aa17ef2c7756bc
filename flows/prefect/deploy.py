"""Prefect deployments of the flows, per model: `<model>-daily` (cron), `<model>-on-demand`, `<model>-backfill`.

    ctrpipe deploy [--pool ctr-process] [--config FILE] [--cron "0 2 * * *"] [--no-alerts]  # a worker runs them
    ctrpipe serve  [--config FILE] [--cron ...] [--no-alerts]                    # one process, no work pool

Deployment names carry the model's name, so several models share one Prefect
server: deploying one leaves the others' deployments, schedules and
automations in place.  Deploy and serve also create the model's alert automations
(`flows.prefect.alerts`), keyed by the model and its root; deploy checks what can be refused (the
alerts' webhook, the work pool) before it registers anything.  The config is frozen into the
deployments' parameters: edit the file and deploy again (each run logs the digest of its config).  The daily deployment
passes no date: the flow computes the
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


def check_pool(name: str) -> None:
    """Raises ValueError naming the pool and how to make it when the server has no work pool `name`."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            raise ValueError(
                f"no work pool {name!r} on the Prefect server: create it first (e.g. `prefect work-pool create "
                f"{name} --type kubernetes --base-job-template infra/k8s/work-pool-template.json`), or deploy to "
                f"{DEFAULT_POOL!r}, which deploy creates"
            ) from None


def deployment_names(model_name: str) -> dict[str, str]:
    """kind -> the model's deployment name (`daily-retrain/<model>-daily`, ...)."""
    return {kind: f"{model_name}-{kind}" for kind in ("daily", "on-demand", "backfill")}


def alert_block(config: dict[str, Any], alerts: bool) -> tuple[Any, Any]:
    """(the alerts config, its notification block's id), or (None, None) without alerts.

    Raises:
        ValueError: alerts are wanted but there is no webhook URL and no block (`flows.prefect.alerts.ensure_block`).
    """
    from flows.prefect.alerts import AlertsConfig, ensure_block
    from storage.io import codec

    if not alerts:
        return None, None
    cfg = codec.decode(AlertsConfig, config.get("alerts"), prefix="alerts.")
    return cfg, ensure_block(cfg)


def _deployments(
    flows: dict[str, Any], config: dict[str, Any], *, cron: str, timezone: str, **common: Any
) -> dict[str, Any]:
    """The model's three deployments (not yet on the server), by name; `flows` holds `daily` and `backfill`."""
    from prefect.schedules import Cron

    from flows.config import from_dict
    from flows.prefect.keys import run_tags

    layout = from_dict(config).layout()
    model = layout.model_name
    names = deployment_names(model)
    tags = ["ctr-pipeline", *run_tags(layout)]
    return {
        names["daily"]: flows["daily"].to_deployment(
            name=names["daily"],
            schedules=[Cron(cron, timezone=timezone)],
            parameters={"config": config},
            description=f"Scheduled daily retrain of model {model}: the day before the scheduled time.",
            tags=tags,
            **common,
        ),
        names["on-demand"]: flows["daily"].to_deployment(
            name=names["on-demand"],
            parameters={"config": config},
            description=f"Retrain model {model} on one date now: --param date=YYYY-MM-DD"
            f" [--param overrides='{{...}}'].",
            tags=tags,
            **common,
        ),
        names["backfill"]: flows["backfill"].to_deployment(
            name=names["backfill"],
            parameters={"config": config},
            description=f"Retrain model {model} on a date range in order: --param start=... --param end=...;"
            " resumable.",
            tags=tags,
            **common,
        ),
    }


def deploy_all(
    config: dict[str, Any],
    *,
    pool: str = DEFAULT_POOL,
    cron: str = DEFAULT_CRON,
    timezone: str = "UTC",
    source: str | Path = REPO,
    alerts: bool = True,
    create_pool: bool = False,
) -> dict[str, str]:
    """Register the model's three deployments and its automations on the server at PREFECT_API_URL.

    All or nothing: what can be refused (no webhook URL nor block for the alerts, no work pool) is
    checked before anything is registered.  The config is frozen into the deployments' parameters:
    an edited config file takes effect when deploy runs again (every run logs its config's digest).

    Args:
        create_pool: create `pool` as a process work pool when the server has none.

    Returns:
        deployment (or automation) name -> id.
    """
    from prefect import flow

    from flows.config import from_dict
    from flows.prefect.alerts import upsert_automations
    from flows.prefect.slot import ensure_limit

    layout = from_dict(config).layout()
    if not create_pool:  # check first: what can be refused raises before anything is registered
        check_pool(pool)
    alerts_cfg, block_id = alert_block(config, alerts)
    if create_pool:
        ensure_process_pool(pool)
    ensure_limit(layout)
    # from_source and to_deployment are typed `X | Coroutine[X]`; called from sync code they return X.
    flows: dict[str, Any] = {
        "daily": flow.from_source(source=str(source), entrypoint=DAILY_ENTRY),
        "backfill": flow.from_source(source=str(source), entrypoint=BACKFILL_ENTRY),
    }
    # `apply`, not `Flow.deploy`: the same registration without Prefect's three tables on stdout
    deployments = _deployments(flows, config, cron=cron, timezone=timezone, work_pool_name=pool)
    out = {name: str(dep.apply(work_pool_name=pool)) for name, dep in deployments.items()}
    if alerts_cfg is not None:
        out.update(upsert_automations(layout, out[deployment_names(layout.model_name)["daily"]], alerts_cfg, block_id))
    return out


def serve_all(
    config: dict[str, Any], *, cron: str = DEFAULT_CRON, timezone: str = "UTC", alerts: bool = True, report: Any = print
) -> None:
    """Serve the three deployments from this process (the single-process alternative to a worker).

    Against a Prefect server (PREFECT_API_URL) the model's automations are registered as `deploy_all`
    does, checked first; with the temporary local server that `ctrpipe serve` starts otherwise there is
    nothing to send alerts from, so none are made, and `report` says so.
    """
    from prefect import serve

    from flows.config import from_dict
    from flows.prefect.alerts import upsert_automations
    from flows.prefect.daily import backfill, daily_retrain
    from flows.prefect.slot import ensure_limit, server_configured

    layout = from_dict(config).layout()
    deployments = _deployments({"daily": daily_retrain, "backfill": backfill}, config, cron=cron, timezone=timezone)
    if server_configured():
        alerts_cfg, block_id = alert_block(config, alerts)  # check first: raises before anything is registered
        ensure_limit(layout)
        if alerts_cfg is not None:
            # the no-daily-run automation names the daily deployment: register it now (serve updates it in place)
            daily_id = str(deployments[deployment_names(layout.model_name)["daily"]].apply())
            for name, automation_id in upsert_automations(layout, daily_id, alerts_cfg, block_id).items():
                report(f"automation {name}: {automation_id}")
        else:
            report("no alert automations (--no-alerts)")
    else:
        report(
            "no alert automations: this is a temporary Prefect server (set PREFECT_API_URL to serve against "
            "yours, which keeps the automations)"
        )
    serve(*deployments.values())
