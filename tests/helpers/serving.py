"""Serving bundles made without training, a real score-server process, and a plain HTTP client for it."""

from __future__ import annotations

import dataclasses
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flows.serving.bundle import now_iso
from flows.serving.export import write_full_bundle
from pipeline.encode.feature_spec import FeatureSpec
from pipeline.encode.keys import feature_keys
from pipeline.schema import get_schema
from tests.helpers.procs import processes, start
from trainer import export
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.model_dir import ModelMeta
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel

CRITEO = get_schema("criteo")
TINY = ModelConfig(num_heads=1, mlp_dims=(8,), dense_buckets=4, dropout=0.0)
DIM = 4


def criteo_line(i: int, label: int = 0) -> str:
    """A valid Criteo line whose values depend on `i` (values of i % 7 repeat, so some are admitted)."""
    dense = [str((i * (j + 1)) % 50) for j in range(13)]
    cats = [f"{j:02d}{i % 7:06x}" for j in range(26)]
    return "\t".join([str(label), *dense, *cats])


def tiny_model(seed: int = 0) -> tuple[ModelMeta, CTRModel]:
    torch.manual_seed(seed)
    network = CTRModel(TINY, num_dense=13, num_fields=26, dim=DIM).eval()
    meta = ModelMeta.of(
        model_name="ctr",
        model_config=TINY,
        dim=DIM,
        init_std=0.05,
        num_dense=13,
        num_fields=26,
        fields=CRITEO.categorical,
        dense_columns=tuple(f"d_{i}" for i in range(13)),
        key_columns=tuple(f"k_{j}" for j in range(26)),
        vocab_date="2026-01-01",
        run_tag=f"tiny-{seed}",
        features_url="",
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
    )
    return meta, network


def tiny_rows(seed: int = 0, n_values: int = 5, dtype: str = "float32") -> tuple[np.ndarray, export.SparseRows]:
    """(admitted keys, rows): the keys of values `criteo_line` writes for i % 7 < n_values, and their rows."""
    values = {c: [f"{j:02d}{v:06x}" for v in range(n_values)] for j, c in enumerate(CRITEO.categorical)}
    keys = np.unique(np.concatenate([feature_keys(j, values[c]) for j, c in enumerate(CRITEO.categorical)]))
    emb = np.random.default_rng(seed).normal(0, 0.1, (keys.size, DIM)).astype(np.float32)
    return keys, export.cast_rows(export.SparseRows(keys, emb), dtype)


def write_tiny_bundle(
    url: str, *, version: str = "v00001", seed: int = 0, dtype: str = "float32", negative_sampling: float = 1.0
) -> dict[str, Any]:
    """A full bundle of a random tiny Criteo model at `url` (no registry, no training), recorded as trained with
    `negative_sampling` (the keep-rate of negatives); returns its manifest."""
    meta, network = tiny_model(seed)
    meta = dataclasses.replace(meta, negative_sampling=negative_sampling)
    admitted, rows = tiny_rows(seed, dtype=dtype)
    spec = FeatureSpec(
        schema=CRITEO,
        admitted=admitted,
        bag_pooling=TINY.bag_pooling,
        dense_buckets=TINY.dense_buckets,
        dense_bucket_max=TINY.dense_bucket_max,
    )
    manifest = {
        "version": version,
        "model_name": "ctr",
        "dtype": dtype,
        "metrics": {"auc": 0.5 + seed / 100},
        "dates_trained": ["2026-01-01"],
        "exported": now_iso(),
    }
    return write_full_bundle(
        url,
        meta=meta,
        spec=spec,
        program=export.program_bytes(export.export_program(network)),
        rows=rows,
        manifest=manifest,
    )


# ---- the server ---------------------------------------------------------------------------------
def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """One HTTP request to 127.0.0.1:`port`; returns (status, decoded JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})} if data is not None else dict(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
    finally:
        conn.close()


def wait_ready(port: int, proc: subprocess.Popen, *, path: str = "/readyz", timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"score-server exited with {proc.returncode} before {path} answered 200")
        try:
            if call(port, "GET", path, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"score-server on port {port}: {path} not 200 within {timeout}s")


@contextmanager
def score_server(
    args: list[str], port: int, log: Path, *, env: dict | None = None, ready_path: str = "/readyz"
) -> Iterator[subprocess.Popen]:
    """`ctrpipe score-server ARGS --port PORT` in a child process, stopped on exit (even on failure)."""
    with processes() as procs:
        proc = start(
            procs, [sys.executable, "-m", "flows.cli.main", "score-server", *args, "--port", str(port)], log, env
        )
        wait_ready(port, proc, path=ready_path)
        yield proc


def day_config(root: Path, input_url: str, **overrides: Any) -> Any:
    """The demo preset on `root`, reading `input_url`, with threads
    for Dask and a lenient gate (every day publishes)."""
    from flows.config import with_overrides
    from flows.presets import demo

    return with_overrides(
        demo(str(root)),
        {
            "input.url": input_url,
            "dask.processes": False,
            "dask.n_workers": 2,
            "optim.batch_size": 128,
            "publish.max_auc_drop": 1.0,
            "publish.min_auc": 0.0,
            "publish.max_logloss_increase": 1.0,
            "publish.calibration_range": [0.0, 100.0],
            **overrides,
        },
    )


def cli_args(cfg: Any) -> list[str]:
    """`--preset demo --set ...` that rebuild `cfg` in a `ctrpipe` child process."""
    return [
        "--preset",
        "demo",
        "--set",
        f"root={cfg.root}",
        "--set",
        f"input.url={cfg.input.url}",
        "--set",
        f"input.format={cfg.input.format}",
    ]
