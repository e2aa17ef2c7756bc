"""Prefect's settings for a command that starts flows: offline-friendly defaults where the user set none."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def prefect_defaults(root: str | None = None) -> None:
    """Offline-friendly Prefect settings, applied only where the user set nothing (before prefect is imported)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    if root and "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_HOME"] = str(Path(root).resolve() / ".prefect")
    if "PREFECT_API_URL" not in os.environ:
        logging.getLogger("ctrpipe").info("starting a temporary Prefect server (set PREFECT_API_URL to use yours)")
