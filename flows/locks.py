"""One run at a time per model: a Prefect global concurrency limit around train -> publish.

Two runs of the same model (a scheduled run and an on-demand one, or two
backfills) would otherwise share the node-local SSD shards and race on
`LATEST`.  The limit lives in the Prefect database, so it holds across
processes and machines that talk to the same Prefect server (and across
ephemeral-mode processes sharing one PREFECT_HOME).  The second run waits up
to `publish.lock_timeout_s`, then fails with a message naming the limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from prefect.client.orchestration import get_client
from prefect.concurrency.sync import concurrency


class ModelBusyError(RuntimeError):
    """Another run of the same model held the train/publish slot for longer than the timeout."""


def limit_name(model_name: str) -> str:
    return f"ctr-train-publish-{model_name}"


def ensure_limit(model_name: str) -> str:
    """Create the model's limit (1 slot) if it does not exist yet; returns its name."""
    name = limit_name(model_name)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    return name


@contextmanager
def model_slot(model_name: str, timeout_s: float) -> Iterator[None]:
    """Hold the model's single train/publish slot for the duration of the block."""
    name = ensure_limit(model_name)
    with ExitStack() as stack:
        try:
            stack.enter_context(
                concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True, lease_duration=600)
            )
        except TimeoutError as exc:
            raise ModelBusyError(
                f"another run of model {model_name!r} held the Prefect concurrency limit {name!r} for more than "
                f"{timeout_s:.0f}s; wait for it to finish (see the Prefect UI) or raise publish.lock_timeout_s"
            ) from exc
        yield
