"""Dask ingest of raw ad logs into Parquet, feature vocabularies, encoding for the trainer."""
