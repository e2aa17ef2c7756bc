"""Registry version -> serving bundle (full or delta), and the bundles the publish stage writes.

`ctrpipe export` and the publish stage both come through `VersionExport`: the version's network,
rows (with clocks, to find what changed), feature spec and metadata are read once, then written as
a full bundle and/or as a delta against a base version.

The publish stage writes the bundles (`write_bundles`): a full bundle of every version it publishes
at `Layout.bundle(v)` and a delta from the version it replaces at `Layout.bundle_delta(v, previous)`,
before `LATEST` moves; then it moves `Layout.bundle_latest()` (`point_servers_at`).  Export at publish rather than on
demand because the admitted
keys must be frozen from the vocabulary the model was trained with, and `vocab/date=D` is rebuilt
by a `--force` rerun; a serving host then only ever reads bundles.  `ctrpipe export` writes a
bundle of any version on demand (another dtype, ONNX, a delta from any base) and refuses when the
vocabulary was rebuilt since the model was trained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from flows.serving.bundle import (
    ADMITTED,
    COMPANION,
    EMB,
    EVICTED,
    FEATURE_SPEC,
    KEYS,
    MODEL_JSON,
    ONNX,
    PROGRAM,
    now_iso,
    npy_bytes,
    write_bundle,
)
from pipeline.encode.feature_spec import FeatureSpec
from pipeline.schema import get_schema
from pipeline.vocab.manifest import read_vocab_manifest
from pipeline.vocab.stage import load_admitted
from storage.features_manifest import read_features_manifest
from storage.io import fsio
from storage.io.layout import Layout
from storage.io.registry import Lineage, ModelRegistry, RegistryError
from trainer import export, model_dir
from trainer.companion.file import load as load_companion
from trainer.companion.file import to_bytes as companion_bytes
from trainer.companion.model import Companion
from trainer.model_dir import ModelMeta

log = logging.getLogger("ctrpipe")


class ExportError(RuntimeError):
    """A version cannot be exported as asked (the message says why and what to do)."""


def onnx_refused(what: str) -> ExportError:
    """The refusal of an ONNX network of a model with a companion, which the ONNX file cannot carry."""
    return ExportError(
        f"{what} blends a companion (model.companion) that an ONNX network does not carry: a server "
        "of dense.onnx alone would score without it; export without --onnx, or train with "
        "model.companion=off"
    )


def model_files(
    meta: ModelMeta, spec: FeatureSpec, program: bytes, onnx: bytes | None = None, companion: bytes | None = None
) -> dict[str, bytes]:
    """The files every bundle holds besides its rows: model.json, the network(s), the feature spec, and the
    companion's weights when the model has one.

    Raises:
        ExportError: ONNX asked of a model with a companion (the ONNX file would score without it), or a
            companion's record without its weights.
    """
    import json

    if meta.companion and onnx is not None:
        raise onnx_refused("the model")
    if bool(meta.companion) != (companion is not None):
        raise ExportError("model.json and the companion's weights disagree: retrain the model")
    files = {
        MODEL_JSON: json.dumps(meta.to_dict(), indent=2, sort_keys=True).encode(),
        PROGRAM: program,
        FEATURE_SPEC: json.dumps(spec.to_dict(), indent=2, sort_keys=True).encode(),
        ADMITTED: npy_bytes(spec.admitted),
    }
    if onnx is not None:
        files[ONNX] = onnx
    if companion is not None:
        files[COMPANION] = companion
    return files


def row_files(rows: export.SparseRows) -> dict[str, bytes]:
    """`rows/keys.npy` and `rows/emb.npy` of a table (of a delta: its changed rows)."""
    return {KEYS: npy_bytes(rows.keys), EMB: npy_bytes(rows.emb)}


def version_rows(layout: Layout, version: str) -> export.SparseRows:
    """Key, vector and clock of every row of a registry version (what a delta is computed against)."""
    registry = ModelRegistry(layout)
    url = registry.url(version)
    meta = model_dir.read_meta(url, layout.storage_options)
    return export.read_rows(fsio.join(url, model_dir.SPARSE), dim=meta.dim, storage_options=layout.storage_options)


def write_full_bundle(
    url: str,
    *,
    meta: ModelMeta,
    spec: FeatureSpec,
    program: bytes,
    rows: export.SparseRows,
    manifest: dict[str, Any],
    onnx: bytes | None = None,
    companion: bytes | None = None,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Commit a full bundle of a network and its rows at `url` (the manifest gets the row counts and digest)."""
    files = {**model_files(meta, spec, program, onnx, companion), **row_files(rows)}
    manifest = {
        "kind": "full",
        "dim": meta.dim,
        "init_std": meta.init_std,
        "base_version": None,
        **manifest,
        "rows": len(rows),
        "table_rows": len(rows),
        "rows_digest": export.rows_digest(rows),
    }
    return write_bundle(url, files, manifest, storage_options)


@dataclass
class VersionExport:
    """What a bundle of one registry version is made of, read once.

    Args:
        layout: the root and model.
        version: a committed registry version.
    """

    layout: Layout
    version: str

    def __post_init__(self) -> None:
        self.registry = ModelRegistry(self.layout)
        so = self.layout.storage_options
        self.url = self.registry.url(self.version)
        self.meta: ModelMeta = model_dir.read_meta(self.url, so)
        self.lineage: Lineage = self.registry.lineage(self.version)
        self.info = self.registry.info(self.version)
        self.network = model_dir.load_network(self.url, self.meta, so)
        cfg = self.meta.model_cfg()
        self.spec = FeatureSpec(
            schema=get_schema(self._format()),
            admitted=self._admitted(),
            bag_pooling=cfg.bag_pooling,
            dense_buckets=cfg.dense_buckets,
            dense_bucket_max=cfg.dense_bucket_max,
            raw_keys=bool(self.meta.companion),
        )
        if list(self.spec.schema.categorical) != list(self.meta.fields):
            raise ExportError(
                f"{self.version} was trained on fields {list(self.meta.fields)}, but its input format "
                f"{self.spec.schema.name} has {list(self.spec.schema.categorical)}"
            )
        self.rows = version_rows(self.layout, self.version)
        self._program: bytes | None = None
        self.companion: Companion | None = None
        if self.meta.companion:
            try:  # read as every scorer reads it, so a missing or broken file is refused here, not when served
                weight = self.meta.companion_blend_weight
                self.companion = load_companion(fsio.join(self.url, COMPANION), so, blend_weight=weight)
            except (FileNotFoundError, ValueError) as exc:
                raise ExportError(f"{self.version}: {exc}") from None

    def _format(self) -> str:
        fmt = self.lineage.input_format
        if not fmt:
            raise ExportError(f"{self.version}: lineage.json names no input.format; cannot build its feature spec")
        return fmt

    def _admitted(self) -> np.ndarray:
        """The admitted keys of the vocabulary the model was trained with, refused if it was rebuilt since."""
        date, so = self.meta.vocab_date, self.layout.storage_options
        if date is None:
            raise ExportError(f"{self.version} records no vocab_date: its admitted keys are unknown")
        fs, vocab_path = self.layout.fs(self.layout.vocab(date))
        vocab = read_vocab_manifest(fs, vocab_path)
        features_fs, features_path = fsio.get_fs(self.meta.features_url, so)
        features = read_features_manifest(features_fs, features_path)
        if vocab and features and features.vocab_run_id not in (None, vocab.run_id):
            raise ExportError(
                f"vocab/date={date} was rebuilt after {self.version} was trained (run {vocab.run_id}, the "
                f"model used {features.vocab_run_id}): its admitted keys are gone; serve the bundle written "
                "when it was published"
            )
        try:
            return load_admitted(self.layout, date)
        except FileNotFoundError as exc:
            raise ExportError(f"{self.version}: {exc}") from None

    def program(self) -> bytes:
        if self._program is None:
            self._program = export.program_bytes(export.export_program(self.network))
        return self._program

    def _common(self, *, onnx: bool) -> dict[str, bytes]:
        self._refuse_onnx_with_companion(onnx)
        return model_files(
            self.meta,
            self.spec,
            self.program(),
            export.onnx_bytes(self.network) if onnx else None,
            self._companion_bytes(),
        )

    def _companion_bytes(self) -> bytes | None:
        return companion_bytes(self.companion) if self.companion is not None else None

    def _refuse_onnx_with_companion(self, onnx: bool) -> None:
        """Before the (slow) ONNX export: `model_files` would refuse its result."""
        if onnx and self.companion is not None:
            raise onnx_refused(self.version)

    def _manifest(self, kind: str, table: export.SparseRows, dtype: str) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": kind,
            "model_name": self.layout.model_name,
            "dtype": dtype,
            "dim": self.meta.dim,
            "init_std": self.meta.init_std,
            "exported": now_iso(),
            "date": self.lineage.date,
            "dates_trained": list(self.lineage.dates_trained),
            "metrics": self.info.metrics,
            "table_rows": len(table),
            "rows_digest": export.rows_digest(table),
            "network": export.describe_program(self.network, self.meta.negative_sampling),
            "lineage": {
                "registry_version": self.version,
                "registry_url": self.url,
                "parent_version": self.lineage.parent_version,
                "run_tag": self.lineage.run_tag,
                "code_version": self.lineage.code_version,
            },
            "registry_version_bytes": self.registry.version_bytes(self.version),
        }

    def write_full(
        self, out_url: str, *, dtype: str = "float32", onnx: bool = False, dtype_auc: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A full bundle of the version at `out_url`; returns its manifest."""
        self._refuse_onnx_with_companion(onnx)
        table = export.cast_rows(self.rows, dtype)
        return write_full_bundle(
            out_url,
            meta=self.meta,
            spec=self.spec,
            program=self.program(),
            rows=table,
            manifest={**self._manifest("full", table, dtype), "dtype_auc": dtype_auc},
            onnx=export.onnx_bytes(self.network) if onnx else None,
            companion=self._companion_bytes(),
            storage_options=self.layout.storage_options,
        )

    def write_delta(self, out_url: str, base: str, *, dtype: str = "float32", onnx: bool = False) -> dict[str, Any]:
        """A delta bundle: the rows changed (by clock) or evicted since version `base`, plus the network and spec."""
        base_rows = version_rows(self.layout, base)
        if base_rows.dim != self.meta.dim:
            raise ExportError(
                f"{base} has rows of width {base_rows.dim}, {self.version} of {self.meta.dim}: "
                "no delta between them; export a full bundle"
            )
        table, base_table = export.cast_rows(self.rows, dtype), export.cast_rows(base_rows, dtype)
        delta = export.delta_rows(table, base_table)
        files = {**self._common(onnx=onnx), **row_files(delta.rows), EVICTED: npy_bytes(delta.evicted)}
        manifest = {
            **self._manifest("delta", table, dtype),
            "rows": len(delta.rows),
            "base_version": base,
            "base_rows_digest": export.rows_digest(base_table),
            "evicted": int(delta.evicted.size),
            "changed_by_clock": delta.by_clock,
            "changed_by_value": delta.by_value,
        }
        return write_bundle(out_url, files, manifest, self.layout.storage_options)

    def dtype_auc(self, dtype: str) -> dict[str, Any] | None:
        """AUC of the version on its own eval rows with float32 rows and with `dtype` rows (None for float32)."""
        if dtype == "float32":
            return None
        from trainer.data import FeatureSchema
        from trainer.eval.scoring import FrozenEmbeddings, LoadedModel, evaluate_model

        m = self.meta
        schema = FeatureSchema(
            dense_columns=m.dense_columns, key_columns=m.key_columns, fields=m.fields, bag_columns=m.bag_columns
        ).for_pooling(m.model_cfg().bag_pooling)
        eval_url = fsio.join(m.features_url, "eval")
        result: dict[str, Any] = {}
        for d in ("float32", dtype):
            table = FrozenEmbeddings(self.rows.keys, export.cast_rows(self.rows, d).emb, dim=m.dim, init_std=m.init_std)
            try:
                got = evaluate_model(
                    LoadedModel(self.network, table, schema, m, companion=self.companion),
                    eval_url,
                    self.layout.storage_options,
                )
            except FileNotFoundError as exc:
                return {"error": f"the version's eval rows are gone: {exc}"}
            result[d], result["rows"] = got["auc"], got["rows"]
        return {**result, "change": result[dtype] - result["float32"]}


def export_version(
    layout: Layout,
    version: str,
    out_url: str,
    *,
    delta_from: str | None = None,
    dtype: str = "float32",
    onnx: bool = False,
) -> dict[str, Any]:
    """`ctrpipe export`: a full bundle of `version` at `out_url`, or with `delta_from` a delta from that version."""
    if dtype not in export.DTYPES:
        raise ExportError(f"--dtype must be one of {sorted(export.DTYPES)}, got {dtype!r}")
    if onnx and (reason := export.onnx_missing()):
        raise ExportError(reason)
    try:
        target = VersionExport(layout, version)
        if delta_from is None:
            return target.write_full(out_url, dtype=dtype, onnx=onnx, dtype_auc=target.dtype_auc(dtype))
        return target.write_delta(out_url, delta_from, dtype=dtype, onnx=onnx)
    except RegistryError as exc:
        raise ExportError(str(exc)) from None


def write_bundles(layout: Layout, version: str, previous: str | None) -> dict[str, Any]:
    """The publish stage's bundles of `version`: the full bundle, and a delta from `previous` when there is one.

    Written before `LATEST` moves (a version that cannot be exported is not published); the stage then
    moves the servers' pointer (`point_servers_at`).
    """
    target = VersionExport(layout, version)
    full = target.write_full(layout.bundle(version))
    out = {"bundle_bytes": full["bytes_total"], "rows": full["rows"]}
    if previous is not None:
        try:
            delta = target.write_delta(layout.bundle_delta(version, previous), previous)
        except (ExportError, RegistryError, FileNotFoundError) as exc:  # e.g. pruned, or rows of another width
            log.warning("no delta of %s from %s: %s", version, previous, exc)
        else:
            out |= {"delta_from": previous, "delta_bytes": delta["bytes_total"], "delta_rows": delta["rows"]}
    return out


def point_servers_at(layout: Layout, version: str) -> None:
    """Move `Layout.bundle_latest()` to `version` (its bundle must be committed): servers reload it.

    Raises:
        ExportError: the version has no committed bundle.
    """
    fs, bundle = layout.fs(layout.bundle(version))
    if fsio.read_manifest(fs, bundle) is None:
        raise ExportError(
            f"{version} has no bundle at {layout.bundle(version)}: run "
            f"`ctrpipe export --model {version} --out {layout.bundle(version)}` first"
        )
    fsio.write_text_atomic(fs, layout.fs(layout.bundle_latest())[1], version + "\n")


def bundle_sizes(layout: Layout, version: str) -> dict[str, Any] | None:
    """The sizes `models show` reports: the full bundle, each delta to `version`, the registry version.

    None when the version has no bundle (never published, or published before bundles existed).
    """
    from flows.serving.bundle import BundleError, BundleReader

    try:
        full = BundleReader(layout.bundle(version), layout.storage_options).manifest
    except BundleError:
        return None
    deltas = []
    for target, base in ModelRegistry(layout).deltas():
        if target != version:
            continue
        try:
            m = BundleReader(layout.bundle_delta(target, base), layout.storage_options).manifest
        except BundleError:
            continue
        deltas.append(
            {
                "from": base,
                "bytes": m["bytes_total"],
                "rows": m["rows"],
                "evicted": m.get("evicted", 0),
                "bytes_vs_full": round(m["bytes_total"] / max(full["bytes_total"], 1), 4),
            }
        )
    return {
        "full_bytes": full["bytes_total"],
        "rows": full["rows"],
        "dtype": full["dtype"],
        "registry_version_bytes": full.get("registry_version_bytes"),
        "deltas": deltas,
    }
