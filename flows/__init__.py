"""Prefect flows (daily retrain, backfill), the `ctrpipe` command line and run configuration."""
