"""The Prefect edge: the flows (`daily`), deployments, the server's concurrency slot and alert automations.

Only this package imports Prefect at module level; `flows.day.run.run_day` works without it.
"""
