"""Keeping credentials out of what the pipeline writes and registers.

Lineage stores the run's config, and `ctrpipe deploy` stores it in the Prefect server's
deployments; neither may hold a secret.  Credentials come from the environment (or Prefect
Secret blocks), never from committed config.
"""

from __future__ import annotations

from typing import Any

_SECRET_WORDS = {"key", "secret", "token", "password", "passwd", "credential", "credentials", "auth", "apikey"}


def secret_like(name: Any) -> bool:
    """Whether a config key names a credential (`aws_secret_access_key`, `token`, `key`, ...)."""
    tokens = str(name).lower().replace("-", "_").split("_")
    return any(t in _SECRET_WORDS for t in tokens)


def redacted(obj: Any) -> Any:
    """A copy of a config dict with every non-empty value under a credential-like key replaced by '***'."""
    if isinstance(obj, dict):
        return {k: ("***" if secret_like(k) and v not in (None, "", {}) else redacted(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(redacted(v) for v in obj)
    return obj
