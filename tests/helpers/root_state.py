"""What a run left under a storage root, read back as a reader would, to compare a rerun with a reference run."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from storage.io import fsio
from storage.io.layout import Layout
from storage.io.registry import ModelRegistry
from trainer.model_dir import read_meta

_DATA_PREFIX = re.compile(r"^v-[0-9a-f]{12}$")
_LEFTOVER = (".staging-", ".old-", ".tmp-")
MODEL_FILES = (
    "model.json",
    "dense.safetensors",
    "dense_optim.safetensors",
    "metrics.json",
    "lineage.json",
    "status.json",
)


@dataclasses.dataclass(frozen=True)
class DayOutputs:
    """One date's committed outputs: row counts and order-free content hashes, and the record's metrics."""

    events: tuple[int, str]
    quarantine: tuple[int, str]
    vocab: tuple[int, str]
    features: tuple[int, str]
    status: str
    auc: float
    logloss: float
    version: str | None
    parent: str | None


def content(layout: Layout, url: str) -> tuple[int, str]:
    """Rows and a hash of the rows of every Parquet file of committed directory `url`, in any order or parts."""
    fs, path = layout.fs(fsio.data_url(url, layout.storage_options))
    if fsio.read_manifest(fs, path) is None:
        return 0, "not committed"
    hashes = []
    for file in sorted(f for f in fs.find(path) if f.endswith(".parquet")):
        with fs.open(file, "rb") as f:
            frame = pq.read_table(f).to_pandas()
        parts = file[len(path) :].strip("/").split("/")
        name = parts[0] if len(parts) > 1 else ""  # the dataset (a folder of parts) the file belongs to
        hashes.append(pd.util.hash_pandas_object(frame, index=False).to_numpy() ^ _name_hash(name))
    rows = np.sort(np.concatenate(hashes)) if hashes else np.zeros(0, dtype=np.uint64)
    return len(rows), hashlib.sha256(rows.tobytes()).hexdigest()[:16]


def _name_hash(name: str) -> np.uint64:
    return np.frombuffer(hashlib.sha256(name.encode()).digest()[:8], dtype=np.uint64)[0]


def day_outputs(layout: Layout, date: str) -> DayOutputs:
    fs, path = layout.fs(layout.run_record(date))
    rec = fsio.read_json(fs, path) if fs.exists(path) else {}
    return DayOutputs(
        events=content(layout, layout.events(date)),
        quarantine=content(layout, layout.quarantine(date)),
        vocab=content(layout, layout.vocab(date)),
        features=content(layout, layout.features(date)),
        status=rec.get("status", "no record"),
        auc=rec.get("auc", float("nan")),
        logloss=rec.get("logloss", float("nan")),
        version=rec.get("model_version"),
        parent=rec.get("parent_version"),
    )


def differences(ref: DayOutputs, got: DayOutputs, tol: float = 1e-6) -> list[str]:
    """What differs between a reference day and a rerun's (AUC and logloss to `tol`)."""
    out = [
        f"{f.name}: {getattr(ref, f.name)} != {getattr(got, f.name)}"
        for f in dataclasses.fields(DayOutputs)
        if f.name not in ("auc", "logloss") and getattr(ref, f.name) != getattr(got, f.name)
    ]
    out += [
        f"{k}: {getattr(ref, k)} vs {getattr(got, k)}"
        for k in ("auc", "logloss")
        if not abs(getattr(ref, k) - getattr(got, k)) <= tol
    ]
    return out


def chain(layout: Layout) -> list[tuple[str, str, str | None]]:
    """(version, date, parent version) of every registry version, in order."""
    reg = ModelRegistry(layout)
    return [(v, (lin := reg.read_json(v, "lineage.json"))["date"], lin["parent_version"]) for v in reg.versions()]


def registry_problems(layout: Layout, dates: list[str]) -> list[str]:
    """`LATEST` names a complete published version whose files all exist; exactly one version per date."""
    reg = ModelRegistry(layout)
    problems = []
    latest = reg.latest()
    if latest is None:
        problems.append("LATEST is not set")
    else:
        fs, path = reg.fs, reg.path(latest)
        manifest = fsio.read_manifest(fs, path)
        if manifest is None:
            problems.append(f"LATEST names {latest}, which is not committed")
        else:
            files = fsio.data_files(fs, path, manifest)
            base = fsio.data_dir(path, manifest)
            missing = [f for f in MODEL_FILES if f not in files]
            missing += [] if any(f.startswith("sparse/part-") for f in files) else ["sparse/part-*.parquet"]
            empty = [f for f in files if not fs.size(f"{base}/{f}")]
            problems += [f"{latest} lacks {missing}"] if missing else []
            problems += [f"{latest} has empty files {empty}"] if empty else []
            if reg.info(latest).status != "published":
                problems.append(f"LATEST names {latest}, whose status is {reg.info(latest).status}")
            read_meta(reg.url(latest), layout.storage_options)
    per_date = Counter(date for _, date, _ in chain(layout))
    problems += [f"{per_date[d]} registry versions for {d}" for d in dates if per_date[d] != 1]
    return problems


def leftovers(layout: Layout) -> list[str]:
    """Staging, moved-aside and temporary files under the root, and object-store data prefixes nothing names."""
    fs, root = layout.fs()
    fs.invalidate_cache()
    files = fs.find(root)
    bad = sorted({f for f in files if any(t in part for part in f[len(root) :].split("/") for t in _LEFTOVER)})
    prefixes = {(f[: f.index(f"/{p}/")], p) for f in files for p in f.split("/") if _DATA_PREFIX.match(p)}
    for parent, name in sorted(prefixes):
        manifest = fsio.read_manifest(fs, parent)
        if manifest is None or manifest.get(fsio.DATA) != name:
            bad.append(f"{parent}/{name}/ (a data prefix its directory's manifest does not name)")
    return bad
