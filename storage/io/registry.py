"""The model registry: versioned model directories and an atomic `LATEST` pointer.

Layout (readable without this package: JSON metadata, safetensors, Parquet)::

    <root>/models/<name>/<version>/    a committed model directory (see docs/ARCHITECTURE.md)
        model.json  dense.safetensors  dense_optim.safetensors  sparse/part-*.parquet
        metrics.json  lineage.json  status.json  _SUCCESS.json
    <root>/models/<name>/LATEST        the published version id (one line), replaced atomically

On an object store a version's files sit under its data prefix
(`<version>/v-<token>/`, named by its `_SUCCESS.json`: `storage.io.fsio.data_dir`);
`url()` and the reading methods resolve it.

Every candidate that reached the publish gate becomes a version, published or
refused, so a refusal can be inspected later; only `publish()` moves `LATEST`.
Version ids are `v<NNNNN>` in creation order.  A version's manifest names the run
tag it was trained as (`find`), so a rerun never registers the same result twice.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any

from storage.io import fsio
from storage.io.layout import VERSION, Layout, validate_version


class RegistryError(RuntimeError):
    """The registry is missing something the caller asked for."""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    status: str
    """`published` (LATEST now or earlier), `refused` (with reason) or `candidate`."""
    created: str
    reason: str
    metrics: dict[str, Any]


class ModelRegistry:
    """Versions of one model under `<root>/models/<name>/` (`Layout.models`), through fsspec."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.fs, self.base = layout.fs(layout.models())
        self.model_name = layout.model_name

    # ---- reading -------------------------------------------------------------------------
    def latest(self) -> str | None:
        """The published version, or None before the first publish."""
        pointer = self.layout.fs(self.layout.latest_pointer())[1]
        if not self.fs.exists(pointer):
            return None
        with self.fs.open(pointer, "r") as f:
            return validate_version(f.read().strip())

    def path(self, version: str) -> str:
        """Protocol-less path of a version directory (use with `self.fs`)."""
        return self.layout.fs(self.layout.version(version))[1]

    def data_path(self, version: str) -> str:
        """Protocol-less path of a version's files (`fsio.data_dir`; the version directory when not committed)."""
        path = self.path(version)
        manifest = fsio.read_manifest(self.fs, path)
        return path if manifest is None else fsio.data_dir(path, manifest)

    def url(self, version: str) -> str:
        """Full URL of a version's files (for code that opens it through fsspec itself).

        A committed directory in its own right (`fsio.data_url`), valid while the version exists.
        """
        return self.fs.unstrip_protocol(self.data_path(version))

    def versions(self) -> list[str]:
        if not self.fs.exists(self.base):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.base, detail=False)]
        return sorted(
            n for n in names if VERSION.match(n) and fsio.read_manifest(self.fs, self.path(n)) is not None
        )

    def info(self, version: str) -> VersionInfo:
        path = self.path(version)
        if (manifest := fsio.read_manifest(self.fs, path)) is None:
            raise RegistryError(f"model {self.model_name} has no committed version {version} at {path}")
        path = fsio.data_dir(path, manifest)
        status = fsio.read_json(self.fs, f"{path}/status.json")
        metrics = fsio.read_json(self.fs, f"{path}/metrics.json") if self.fs.exists(f"{path}/metrics.json") else {}
        return VersionInfo(
            version=version,
            status=status.get("status", "candidate"),
            created=status.get("created", ""),
            reason=status.get("reason", ""),
            metrics=metrics,
        )

    def read_json(self, version: str, name: str) -> Any:
        return fsio.read_json(self.fs, f"{self.data_path(version)}/{name}")

    # ---- writing -------------------------------------------------------------------------
    def add_version(
        self,
        candidate_url: str,
        *,
        metrics: dict[str, Any],
        lineage: dict[str, Any],
        status: str,
        reason: str = "",
        run_tag: str | None = None,
    ) -> str:
        """Copy a committed candidate model directory into a new version (committed atomically).

        `run_tag` (the trained result's name) goes into the version's manifest, for `find`.
        """
        cand_fs, cand_path = fsio.get_fs(candidate_url, self.layout.storage_options)
        if (cand_manifest := fsio.read_manifest(cand_fs, cand_path)) is None:
            raise RegistryError(f"candidate model {candidate_url} is not committed (no _SUCCESS.json)")
        cand_data = fsio.data_dir(cand_path, cand_manifest)
        existing = self.versions()
        number = int(existing[-1][1:]) + 1 if existing else 1
        version = f"v{number:05d}"
        final = self.path(version)
        self.fs.makedirs(self.base, exist_ok=True)
        with fsio.staged(self.fs, final) as staging:
            for rel in fsio.data_files(cand_fs, cand_path, cand_manifest):
                target = f"{staging}/{rel}"
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                with cand_fs.open(f"{cand_data}/{rel}", "rb") as src, self.fs.open(target, "wb") as dst:
                    while chunk := src.read(8 << 20):
                        dst.write(chunk)
            created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
            fsio.write_json(self.fs, f"{staging}/metrics.json", metrics)
            fsio.write_json(self.fs, f"{staging}/lineage.json", lineage)
            fsio.write_json(
                self.fs, f"{staging}/status.json", {"status": status, "reason": reason, "created": created}
            )
            fsio.commit_dir(self.fs, staging, final, {"version": version, "created": created, "run_tag": run_tag})
        return version

    def find(self, run_tag: str) -> str | None:
        """The newest version registered for `run_tag`, or None: a rerun of a run stopped after it
        registered its version reuses that version instead of adding a second one."""
        for version in reversed(self.versions()):
            manifest = fsio.read_manifest(self.fs, self.path(version))
            if manifest is not None and manifest.get("run_tag") == run_tag:
                return version
        return None

    def publish(self, version: str) -> None:
        """Point `LATEST` at `version` atomically and mark the version published."""
        path = self.path(version)
        if (manifest := fsio.read_manifest(self.fs, path)) is None:
            raise RegistryError(f"cannot publish {version}: {path} is not a committed version")
        path = fsio.data_dir(path, manifest)
        status = fsio.read_json(self.fs, f"{path}/status.json")
        status["status"] = "published"
        status["reason"] = ""
        fsio.write_text_atomic(self.fs, f"{path}/status.json", json.dumps(status, indent=2, sort_keys=True))
        fsio.write_text_atomic(self.fs, self.layout.fs(self.layout.latest_pointer())[1], version + "\n")

    def rollback(self, version: str) -> None:
        """Move `LATEST` back to an earlier published version."""
        info = self.info(version)
        if info.status != "published":
            raise RegistryError(f"{version} was never published ({info.status}: {info.reason}); refusing to roll back to it")
        fsio.write_text_atomic(self.fs, self.layout.fs(self.layout.latest_pointer())[1], version + "\n")
