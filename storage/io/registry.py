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

A version's lineage.json, status.json and metrics.json each carry a `format` (`LINEAGE`, `STATUS`,
`METRICS`; a file from before the field is version 1) and are read tolerantly (`storage.io.records`):
`read_published` reads the lineage at the start of every day, so a field added or retired by another
release must not stop it.

Retention (`prune`, `RegistryConfig`): the newest `keep_versions` published versions are the
rollback window; refused ones are kept `keep_refused_days` for inspection.  A version's serving
bundles (`Layout.bundle`, `Layout.bundle_delta`) go with it, and the base of a kept version's delta
stays, so a server holding that base can still follow the chain to `LATEST`.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any

from storage.io import fsio, records
from storage.io.layout import VERSION, Layout, delta_versions, validate_version

_FIX = "read it with the release that wrote it"
LINEAGE = records.RecordFormat("ctr-pipeline-lineage", 1, absent=1, fix=_FIX)
STATUS = records.RecordFormat("ctr-pipeline-version-status", 1, absent=1, fix=_FIX)
METRICS = records.RecordFormat("ctr-pipeline-version-metrics", 1, absent=1, fix=_FIX)


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


@dataclass(frozen=True, kw_only=True)
class Lineage:
    """A version's lineage.json: where it came from (`flows.day.stages.lineage` writes it; other keys are kept
    in the file and ignored here)."""

    format: str = LINEAGE.tag
    date: str
    """The day trained."""
    dates_trained: tuple[str, ...] = ()
    parent_version: str | None = None
    """The version it warm-started from (None: the first)."""
    run_tag: str | None = None
    vocab_date: str | None = None
    code_version: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    """The run config (credentials redacted), as plain data."""

    @property
    def input_format(self) -> str | None:
        """The `input.format` the version was trained on (its feature spec's schema)."""
        section = self.config.get("input")
        return section.get("format") if isinstance(section, dict) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistryConfig:
    """How many versions the registry keeps (`ModelRegistry.prune`, run after each publish)."""

    keep_versions: int = 14
    """Published versions kept, the newest first: the rollback window (LATEST is always kept)."""
    keep_refused_days: int = 7
    """Refused versions (and candidates never published) are kept this many days after their creation."""

    def __post_init__(self) -> None:
        if self.keep_versions < 1:
            raise ValueError(f"registry.keep_versions must be >= 1 (LATEST is always kept), got {self.keep_versions}")
        if self.keep_refused_days < 0:
            raise ValueError(f"registry.keep_refused_days must be >= 0, got {self.keep_refused_days}")


@dataclass(frozen=True)
class PrunePlan:
    """What `prune` keeps (version -> why) and deletes, and the bytes the deletions free."""

    keep: dict[str, str]
    delete: list[str]
    delete_deltas: list[str] = field(default_factory=list)
    """Delta bundle folder names (`vNNNNN-from-vMMMMM`) whose target or base version goes."""
    freed_bytes: int = 0

    def summary(self) -> str:
        if not self.delete and not self.delete_deltas:
            return f"prune: nothing to delete ({len(self.keep)} versions kept)"
        return (
            f"prune: {len(self.delete)} version(s) {', '.join(self.delete)} and {len(self.delete_deltas)} "
            f"delta(s) deleted, {self.freed_bytes} bytes freed; {len(self.keep)} kept"
        )


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

    def resolve(self, ref: str) -> str:
        """The version `ref` names: `latest` (what LATEST names), `previous` (the newest published version
        older than LATEST: what a rollback returns to) or a version id.

        Raises:
            RegistryError: nothing is published yet, or no published version precedes LATEST.
            ValueError: `ref` is none of these.
        """
        if ref not in ("latest", "previous"):
            try:
                return validate_version(ref)
            except ValueError:
                raise ValueError(f"model version must be latest, previous or look like v00001, got {ref!r}") from None
        latest = self.latest()
        if latest is None:
            raise RegistryError(
                f"model {self.model_name} has no published version under {self.layout.models()} (LATEST is unset); "
                "run a daily retrain first, or check --config / --set root="
            )
        if ref == "latest":
            return latest
        older = [v for v in self.versions() if v < latest and self.info(v).status == "published"]
        if not older:
            raise RegistryError(f"no published version of model {self.model_name} precedes LATEST ({latest})")
        return older[-1]

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
        url: str = self.fs.unstrip_protocol(self.data_path(version))
        return url

    def versions(self) -> list[str]:
        if not self.fs.exists(self.base):
            return []
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.base, detail=False)]
        return sorted(n for n in names if VERSION.match(n) and fsio.read_manifest(self.fs, self.path(n)) is not None)

    def info(self, version: str) -> VersionInfo:
        path = self.path(version)
        if (manifest := fsio.read_manifest(self.fs, path)) is None:
            raise RegistryError(
                f"model {self.model_name} has no committed version {version} at {path} "
                "(`ctrpipe models list` shows the versions)"
            )
        path = fsio.data_dir(path, manifest)
        status = self._record(f"{path}/status.json", STATUS)
        metrics = self._record(f"{path}/metrics.json", METRICS) if self.fs.exists(f"{path}/metrics.json") else {}
        metrics.pop("format", None)
        return VersionInfo(
            version=version,
            status=status.get("status", "candidate"),
            created=status.get("created", ""),
            reason=status.get("reason", ""),
            metrics=metrics,
        )

    def read_json(self, version: str, name: str) -> Any:
        return fsio.read_json(self.fs, f"{self.data_path(version)}/{name}")

    def lineage(self, version: str) -> Lineage:
        """The version's lineage.json.

        Raises:
            FormatError: a version of lineage.json this code does not read (the message says what to do).
        """
        where = self.fs.unstrip_protocol(f"{self.data_path(version)}/lineage.json")
        return records.read_record(Lineage, self.read_json(version, "lineage.json"), fmt=LINEAGE, where=where)

    def _record(self, path: str, fmt: records.RecordFormat) -> dict[str, Any]:
        """A JSON object of a version kept as plain data (status.json, metrics.json), its format checked."""
        data = fsio.read_json(self.fs, path)
        where = self.fs.unstrip_protocol(path)
        if not isinstance(data, dict):
            raise records.FormatError(f"{where} is not a JSON object; it is not a {fmt.name} file")
        fmt.version_of(data, where)
        return data

    def version_bytes(self, version: str) -> int:
        """Bytes the version's directory holds (its files, on an object store its data prefix too)."""
        return _tree_bytes(self.fs, self.path(version))

    def bundle_bytes(self, version: str) -> int:
        """Bytes of the version's serving bundle (0 when it has none)."""
        return _tree_bytes(self.fs, self.layout.fs(self.layout.bundle(version))[1])

    def deltas(self) -> list[tuple[str, str]]:
        """(target, base) of every delta bundle under `Layout.bundle_deltas`."""
        path = self.layout.fs(self.layout.bundle_deltas())[1]
        if not self.fs.exists(path):
            return []
        return sorted(d for p in self.fs.ls(path, detail=False) if (d := delta_versions(p)))

    # ---- retention -----------------------------------------------------------------------
    def prune_plan(self, config: RegistryConfig, *, now: _dt.datetime | None = None) -> PrunePlan:
        """Which versions `prune` keeps and why; deletes nothing.

        Kept: `LATEST`; the newest version (ids are never reused); the newest `keep_versions`
        published versions; refused and never-published versions younger than `keep_refused_days`;
        and the base of the delta bundle of any version kept so far (one level: the base's own
        delta is not needed, the base's full bundle is).  Everything else is deleted with its bundles.
        """
        now = now or _dt.datetime.now(_dt.UTC)
        versions = self.versions()
        keep: dict[str, str] = {}
        if latest := self.latest():
            keep[latest] = "LATEST"
        if versions:
            keep.setdefault(versions[-1], "newest (ids are never reused)")
        infos = {v: self.info(v) for v in versions}
        published = [v for v in versions if infos[v].status == "published"]
        for v in published[-config.keep_versions :]:
            keep.setdefault(v, f"within the rollback window (newest {config.keep_versions} published)")
        horizon = now - _dt.timedelta(days=config.keep_refused_days)
        for v in versions:
            created = infos[v].created
            if infos[v].status != "published" and created and _dt.datetime.fromisoformat(created) >= horizon:
                keep.setdefault(v, f"{infos[v].status}, younger than {config.keep_refused_days} days")
        deltas = self.deltas()
        for target, base in deltas:
            if target in keep and base in versions:
                keep.setdefault(base, f"base of the delta of {target}")
        delete = [v for v in versions if v not in keep]
        gone = [f"{t}-from-{b}" for t, b in deltas if t not in keep or b not in keep]
        freed = sum(self.version_bytes(v) + self.bundle_bytes(v) for v in delete)
        freed += sum(_tree_bytes(self.fs, self.layout.fs(fsio.join(self.layout.bundle_deltas(), d))[1]) for d in gone)
        return PrunePlan(keep=dict(sorted(keep.items())), delete=delete, delete_deltas=gone, freed_bytes=freed)

    def prune(self, config: RegistryConfig, *, dry_run: bool = False, now: _dt.datetime | None = None) -> PrunePlan:
        """Delete what `prune_plan` does not keep (with `dry_run`, only say so).

        Bundles go first, then the registry directories: a server never sees a version whose
        bundle is half deleted named by a pointer, since `LATEST` and its bundle are always kept.
        """
        plan = self.prune_plan(config, now=now)
        if dry_run:
            return plan
        for d in plan.delete_deltas:
            self.fs.rm(self.layout.fs(fsio.join(self.layout.bundle_deltas(), d))[1], recursive=True)
        for v in plan.delete:
            bundle = self.layout.fs(self.layout.bundle(v))[1]
            if self.fs.exists(bundle):
                self.fs.rm(bundle, recursive=True)
            self.fs.rm(self.path(v), recursive=True)
        self.fs.invalidate_cache()
        return plan

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
            fsio.write_json(self.fs, f"{staging}/metrics.json", {**metrics, "format": METRICS.tag})
            fsio.write_json(self.fs, f"{staging}/lineage.json", {**lineage, "format": LINEAGE.tag})
            fsio.write_json(
                self.fs,
                f"{staging}/status.json",
                {"format": STATUS.tag, "status": status, "reason": reason, "created": created},
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
        status = self._record(f"{path}/status.json", STATUS)  # other fields (a newer writer's) are kept
        status["status"] = "published"
        status["reason"] = ""
        fsio.write_text_atomic(self.fs, f"{path}/status.json", json.dumps(status, indent=2, sort_keys=True))
        fsio.write_text_atomic(self.fs, self.layout.fs(self.layout.latest_pointer())[1], version + "\n")

    def rollback(self, version: str) -> None:
        """Move `LATEST` back to an earlier published version."""
        info = self.info(version)
        if info.status != "published":
            raise RegistryError(
                f"{version} was never published ({info.status}: {info.reason}); refusing to roll back to it"
            )
        fsio.write_text_atomic(self.fs, self.layout.fs(self.layout.latest_pointer())[1], version + "\n")


def _tree_bytes(fs: Any, path: str) -> int:
    """Total size of the files under `path` (0 when it does not exist)."""
    if not fs.exists(path):
        return 0
    return int(sum(info.get("size") or 0 for info in fs.find(path, detail=True).values()))
