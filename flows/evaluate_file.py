"""`ctrpipe evaluate`: score a registry model on any raw log file."""

from __future__ import annotations

from typing import Any

from flows.config import RunConfig


def evaluate_log(cfg: RunConfig, model: str, input_url: str, fmt: str) -> dict[str, Any]:
    """Parse `input_url`, encode it with the model's own vocabulary, and return AUC/logloss/rows."""
    from pipeline.encode import encode_frame
    from pipeline.parse import read_log_file
    from pipeline.schema import get_schema
    from pipeline.vocab_stage import load_admitted
    from storage.io.registry import ModelRegistry
    from trainer.evaluate import evaluate_model
    from trainer.model_dir import read_meta

    layout = cfg.layout()
    reg = ModelRegistry(layout)
    version = reg.latest() if model == "latest" else model
    if version is None:
        raise FileNotFoundError(f"no published model {cfg.model_name} under {layout.models()}; run a daily retrain first")
    url = reg.url(version)
    meta = read_meta(url, cfg.storage_options)
    schema = get_schema(fmt)
    if list(meta.fields) != list(schema.categorical):
        raise ValueError(
            f"model {version} was trained on fields {list(meta.fields)} but --format {fmt} has {list(schema.categorical)}"
        )
    events, quarantine = read_log_file(input_url, fmt, storage_options=cfg.input.storage_options)
    if len(events) == 0:
        raise ValueError(f"{input_url}: no valid rows to score ({len(quarantine)} quarantined)")
    features = encode_frame(events, schema, load_admitted(layout, meta.vocab_date))
    metrics = evaluate_model(url, features, storage_options=cfg.storage_options)
    return {
        "auc": metrics["auc"],
        "logloss": metrics["logloss"],
        "rows": metrics["rows"],
        "rows_quarantined": int(len(quarantine)),
        "model": version,
    }
