"""`ctrpipe evaluate`: score a registry model on any raw log file."""

from __future__ import annotations

from typing import Any

from flows.config import RunConfig


def evaluate_log(
    cfg: RunConfig, model: str, input_url: str, fmt: str, *, predictions_url: str | None = None
) -> dict[str, Any]:
    """Parse `input_url`, encode it with the model's own vocabulary, and return AUC/logloss/rows.

    With `predictions_url`, also write every scored row's `line` (1-based line number in the input
    file), `label` and `score` there as one Parquet file: what the online scorer's answers are
    compared with (`tests/flows/serving/test_parity.py`).
    """
    from pipeline.encode import encode_frame
    from pipeline.parse import ORDER_FILE_SHIFT, read_log_file
    from pipeline.schema import get_schema
    from pipeline.vocab_stage import load_admitted
    from storage.io.registry import ModelRegistry
    from trainer.evaluate import evaluate_model, load_model, score
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
    loaded = load_model(url, cfg.storage_options)
    metrics = evaluate_model(loaded, features, storage_options=cfg.storage_options)
    if predictions_url:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from storage.io import fsio

        lines = events["order"].to_numpy() & ((1 << ORDER_FILE_SHIFT) - 1)
        table = pa.table({"line": lines, "label": features["label"].to_numpy(), "score": score(loaded, features)})
        fs, path = fsio.get_fs(predictions_url, cfg.storage_options)
        with fs.open(path, "wb") as f:
            pq.write_table(table, f)
    return {
        "auc": metrics["auc"],
        "logloss": metrics["logloss"],
        "rows": metrics["rows"],
        "rows_quarantined": int(len(quarantine)),
        "model": version,
    }
