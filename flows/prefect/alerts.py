"""Alerts: Prefect automations that tell someone when a model's daily retrain goes wrong.

`ctrpipe deploy` and `ctrpipe serve` create, per model and root, through a Prefect notification block
named `alerts.block` (`<key>` is `flows.prefect.keys.model_key`: the model's name and a short digest of
its root, e.g. `ctr-3fa9c1d2`, so staging and prod of one model on one server alert apart):

    <key>-run-failed      a `daily-retrain` run of the model on that root entered Failed, Crashed,
                          PublishRefused or DataCheckFailed (one notification per run, naming the
                          model, the run's date and reason: the state message)
    <key>-no-daily-run    no run of the model's `<model>-daily` deployment completed within
                          `alerts.expect_within` hours (a proactive trigger)

Runs are matched by the tag `ctr-model:<key>` (`flows.prefect.keys.run_tags`), which a run carries from
its creation: the deployments' tags, and `flows.prefect.daily.model_tags` around the CLI's calls.

The default block is a custom webhook whose URL comes from the environment variable
`alerts.url_env` or from the Prefect Secret `alerts.url_secret` at deploy time, stored as a secret
value of the block, never in committed config; a block of that name that already exists (e.g. one
made in the UI for Slack) is used as it is when neither is set.  Rerunning deploy updates the
automations in place (found by name), so they are never duplicated, and deletes the model's automations
of the earlier naming (`legacy_automations`).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from typing import Any

from flows.prefect.keys import KEY_TAG, model_key
from storage.io.layout import Layout

DAILY_FLOW = "daily-retrain"
ALERT_STATES = ("Failed", "Crashed", "PublishRefused", "DataCheckFailed")
"""The flow-run states of a `daily-retrain` run that are alerted on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertsConfig:
    """The `alerts` section: where `ctrpipe deploy`'s automations send, and when a missing run alerts."""

    block: str = "ctr-alerts"
    """Name of the Prefect notification block the automations send through."""
    url_env: str = "CTRPIPE_ALERT_WEBHOOK_URL"
    """Environment variable holding the webhook URL; deploy (re)writes the block from it when it is set."""
    url_secret: str = ""
    """Name of a Prefect Secret block holding the webhook URL (used when `url_env` is not set)."""
    expect_within: float = 26.0
    """Hours: alert when no run of the model's daily deployment completed within this long."""

    def __post_init__(self) -> None:
        if not self.block:
            raise ValueError("alerts.block must name a Prefect notification block")
        if self.expect_within * 3600 < 10:
            raise ValueError(f"alerts.expect_within must be at least 10 s (in hours), got {self.expect_within}")


def failed_run_automation(layout: Layout) -> str:
    return f"{model_key(layout)}-run-failed"


def missing_run_automation(layout: Layout) -> str:
    return f"{model_key(layout)}-no-daily-run"


def webhook_url(cfg: AlertsConfig) -> str | None:
    """The webhook URL from the environment or the Prefect Secret, or None when neither is set."""
    if url := os.environ.get(cfg.url_env, ""):
        return url
    if cfg.url_secret:
        from prefect.blocks.system import Secret

        return str(Secret.load(cfg.url_secret).get())  # type: ignore[union-attr]  # sync: a Secret, not a coroutine
    return None


def ensure_block(cfg: AlertsConfig) -> Any:
    """The notification block's id: written from the webhook URL when one is given, else the existing block.

    Raises:
        ValueError: no URL is given and no block of that name exists.
    """
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client

    url = webhook_url(cfg)
    if url:
        block = CustomWebhookNotificationBlock(  # type: ignore[call-arg]  # headers, cookies have defaults
            name=cfg.block,
            url="{{webhook_url}}",
            secrets={"webhook_url": url},  # type: ignore[arg-type]  # coerced to SecretDict
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        )
        return block.save(cfg.block, overwrite=True)
    with get_client(sync_client=True) as client:  # a block of any type (Slack, email, ...) made by hand
        for doc in client.read_block_documents():
            if doc.name == cfg.block:
                return doc.id
    raise ValueError(
        f"no notification block {cfg.block!r} on the Prefect server and no webhook URL to create it: set "
        f"{cfg.url_env}, or alerts.url_secret to a Prefect Secret holding the URL, or create the block, or deploy "
        "with --no-alerts"
    )


def automations(layout: Layout, block_id: Any, daily_deployment_id: str, cfg: AlertsConfig) -> list[Any]:
    """The two automations of `layout`'s model and root (not yet on the server)."""
    from prefect.automations import Automation, EventTrigger, Posture, SendNotification

    model_name, where = layout.model_name, f"{layout.model_name} on {layout.root}"
    tag: dict[str, str | list[str]] = {
        "prefect.resource.id": f"prefect.tag.{KEY_TAG}:{model_key(layout)}",
        "prefect.resource.role": "tag",
    }
    flow: dict[str, str | list[str]] = {"prefect.resource.role": "flow", "prefect.resource.name": DAILY_FLOW}
    failed = Automation(
        name=failed_run_automation(layout),
        description=f"A {DAILY_FLOW} run of model {where} failed, crashed, or was refused by a guard.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related=[flow, tag],
            expect={f"prefect.flow-run.{s}" for s in ALERT_STATES},
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
            within=_dt.timedelta(0),
        ),
        actions=[
            SendNotification(
                block_document_id=block_id,
                subject=f"ctr-pipeline: model {model_name}: {{{{ flow_run.state.name }}}}",
                body=(
                    f"model {where}: {DAILY_FLOW} run {{{{ flow_run.name }}}} ended "
                    "{{ flow_run.state.name }}: {{ flow_run.state.message }}"
                ),
            )
        ],
    )
    missing = Automation(
        name=missing_run_automation(layout),
        description=f"No daily run of model {where} completed within {cfg.expect_within:g} h.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.id": f"prefect.deployment.{daily_deployment_id}"},
            expect={"prefect.flow-run.Completed"},
            posture=Posture.Proactive,
            threshold=1,
            within=_dt.timedelta(hours=cfg.expect_within),
        ),
        actions=[
            SendNotification(
                block_document_id=block_id,
                subject=f"ctr-pipeline: model {model_name}: no daily run",
                body=f"model {where}: no run of its daily deployment completed within {cfg.expect_within:g} h",
            )
        ],
    )
    return [failed, missing]


def upsert_automations(
    layout: Layout, daily_deployment_id: str, cfg: AlertsConfig, block_id: Any = None
) -> dict[str, str]:
    """Create or update the automations of `layout`'s model and root (found by name); returns name -> automation id.

    Args:
        block_id: the notification block (`ensure_block`, called here when None).
    """
    from prefect.automations import Automation

    block_id = ensure_block(cfg) if block_id is None else block_id
    out = {}
    for automation in automations(layout, block_id, daily_deployment_id, cfg):
        existing: Any  # Automation.read/create are typed `X | Coroutine[X]`; called from sync code they return X
        try:
            existing = Automation.read(name=automation.name)
        except ValueError:
            existing = None
        if existing is None:
            out[automation.name] = str(automation.create().id)
        else:
            automation.id = existing.id
            automation.update()
            out[automation.name] = str(existing.id)
    for name in legacy_automations(layout.model_name):  # they match runs by `model:<name>`: a second alert
        try:
            old: Any = Automation.read(name=name)
        except ValueError:
            continue
        if name not in out:
            old.delete()
    return out


def legacy_automations(model_name: str) -> list[str]:
    """The names of the model's automations before they were keyed by root (`ctr-<model>-run-failed`, ...):
    deploy and serve delete them, or every failure of the model on any root would alert twice."""
    return [f"ctr-{model_name}-run-failed", f"ctr-{model_name}-no-daily-run"]
