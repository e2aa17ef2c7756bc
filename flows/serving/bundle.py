"""The serving bundle: a committed directory holding everything a server needs to score one version.

    manifest.json        `BUNDLE_FORMAT`: version, kind (full | delta), base version, lineage pointer,
                         rows and digests, dtype, metrics, and the sha256 and size of every file below
    model.json           the version's `ModelMeta` (columns, dim, init_std of keys never trained)
    dense.pt2            the dense network (`torch.export.save`; load with `torch.export.load`)
    dense.onnx           the same network as ONNX (only when exported with the `onnx` extra)
    feature_spec.json    `pipeline.encode.feature_spec.FeatureSpec`: raw line -> training inputs
    admitted.npy         int64 ascending: the admitted keys frozen from the model's own vocabulary
    rows/keys.npy        int64 ascending: the keys of the rows (of a delta: the changed rows)
    rows/emb.npy         float32 or float16 (N, D): their vectors, no optimizer state
    evicted.npy          a delta only: int64 ascending, keys of the base absent from the target
    companion.safetensors  a model with a companion only (`trainer.companion`): its weights, whole in a delta too
    _SUCCESS.json        the commit point (`storage.io.fsio`; on an object store the files sit under v-<token>/)

Only documented formats (JSON, NumPy `.npy` read with `allow_pickle=False`, torch.export's `.pt2`,
ONNX, safetensors), so a bundle is read without this package's classes and never unpickled.  `.npy` rather
than Parquet for the rows: `--mmap` maps `rows/emb.npy` as it lies.  Readers check every file's
size and sha256 against the manifest before using it (`BundleReader.read`).

A bundle outlives the trainer that wrote it and the scorer that reads it: the manifest's `format`
(`BUNDLE`) is checked by `storage.io.records` (a newer version is refused naming the versions read;
fields this code does not know are ignored), and the scorer reads model.json through its own small
schema (`flows.serving.model.ServingMeta`), so an older scorer loads a newer trainer's bundle.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.io import fsio, records

BUNDLE = records.RecordFormat(
    "ctr-pipeline-bundle", 1, fix="export it again: `ctrpipe export --model VERSION --out URL`"
)
"""manifest.json: version 1 is what today's code writes."""
BUNDLE_FORMAT = BUNDLE.tag
MANIFEST = "manifest.json"
MODEL_JSON = "model.json"
PROGRAM = "dense.pt2"
ONNX = "dense.onnx"
FEATURE_SPEC = "feature_spec.json"
ADMITTED = "admitted.npy"
KEYS = "rows/keys.npy"
EMB = "rows/emb.npy"
EVICTED = "evicted.npy"
COMPANION = "companion.safetensors"
KINDS = ("full", "delta")


class BundleError(RuntimeError):
    """A bundle is missing, not committed, of another format, or a file fails its checksum."""


def npy_bytes(array: np.ndarray) -> bytes:
    """An array as a `.npy` file (no pickles: plain dtypes only)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npy_array(data: bytes | bytearray) -> np.ndarray:
    """The array of a `.npy` file's bytes, without a copy (a view of `data`; writable when `data` is a bytearray).

    Raises:
        BundleError: not a `.npy` file of a plain dtype (object arrays would need pickles).
    """
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(buf)
    except ValueError as exc:
        raise BundleError(f"not a .npy file: {exc}") from None
    if dtype.hasobject:
        raise BundleError("a .npy file of Python objects is refused (it would need pickles)")
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(data, dtype=dtype, count=count, offset=buf.tell()).reshape(
        shape, order="F" if fortran else "C"
    )


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def write_bundle(
    url: str, files: dict[str, bytes], manifest: dict[str, Any], storage_options: dict | None = None
) -> dict[str, Any]:
    """Commit `files` (name -> content) and their manifest at `url`, atomically; returns the manifest written.

    `manifest` must hold `version` and `kind`; `files`, `bytes_total` and `format` are added here.
    """
    if manifest.get("kind") not in KINDS or "version" not in manifest:
        raise ValueError(f"a bundle manifest needs a version and a kind in {KINDS}, got {manifest.get('kind')!r}")
    fs, final = fsio.get_fs(url, storage_options)
    entries: dict[str, dict[str, Any]] = {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()
    }
    full = {
        **manifest,
        "format": BUNDLE_FORMAT,
        "files": dict(sorted(entries.items())),
        "bytes_total": sum(e["bytes"] for e in entries.values()),
    }
    parent = final.rstrip("/").rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    with fsio.staged(fs, final) as stage:
        for name, data in files.items():
            target = fsio.join(stage, name)
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            with fs.open(target, "wb") as f:
                f.write(data)
        fsio.write_json(fs, fsio.join(stage, MANIFEST), full)
        fsio.commit_dir(fs, stage, final, {"format": BUNDLE_FORMAT, "version": full["version"], "kind": full["kind"]})
    return full


@dataclass
class BundleReader:
    """A committed bundle: its manifest, and its files read with their checksums checked.

    Raises (on construction):
        BundleError: `url` is not a committed bundle of this format.
    """

    url: str
    storage_options: dict | None = None

    def __post_init__(self) -> None:
        self.fs, path = fsio.get_fs(self.url, self.storage_options)
        if (commit := fsio.read_manifest(self.fs, path)) is None:
            raise BundleError(
                f"no committed bundle at {self.url} (no {fsio.SUCCESS}); export one with "
                "`ctrpipe export --model VERSION --out URL`"
            )
        self.path = fsio.data_dir(path, commit)
        try:
            self.manifest: dict[str, Any] = fsio.read_json(self.fs, fsio.join(self.path, MANIFEST))
        except (OSError, ValueError) as exc:
            raise BundleError(f"bundle {self.url}: unreadable {MANIFEST}: {exc}") from exc
        where = fsio.join(self.url, MANIFEST)
        if not isinstance(self.manifest, dict):
            raise BundleError(f"{where} is not a JSON object; export the bundle again")
        try:
            BUNDLE.version_of(self.manifest, where)
        except records.FormatError as exc:
            raise BundleError(str(exc)) from None
        missing = [k for k in ("version", "kind", "files") if k not in self.manifest]
        if missing or not isinstance(self.manifest["files"], dict):
            raise BundleError(
                f"{where} lacks {', '.join(missing) or 'a files mapping'}: the bundle is corrupt; export it again"
            )

    @property
    def version(self) -> str:
        return self.manifest["version"]

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    def has(self, name: str) -> bool:
        return name in self.manifest["files"]

    def file_path(self, name: str) -> str:
        """Protocol-less path of a file of the bundle (on `self.fs`)."""
        return fsio.join(self.path, name)

    def read(self, name: str) -> bytearray:
        """The bytes of file `name`, after checking its size and sha256 against the manifest.

        Raises:
            BundleError: the file is not in the manifest, is missing, or its content differs.
        """
        entry = self.manifest["files"].get(name)
        if entry is None:
            raise BundleError(f"bundle {self.url} has no {name} (files: {sorted(self.manifest['files'])})")
        data = bytearray(entry["bytes"])  # read in place: a large rows file is held once
        try:
            with self.fs.open(self.file_path(name), "rb") as f:
                got = f.readinto(data)
                extra = f.read(1)
        except OSError as exc:
            raise BundleError(f"bundle {self.url}: cannot read {name}: {exc}") from exc
        if got != entry["bytes"] or extra:
            raise BundleError(
                f"bundle {self.url}: {name} is not {entry['bytes']} bytes long as its manifest says: "
                "the bundle is corrupt; export it again"
            )
        self.check(name, data)
        return data

    def check(self, name: str, data: bytes | bytearray) -> None:
        entry = self.manifest["files"][name]
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise BundleError(
                f"bundle {self.url}: {name} fails its checksum ({len(data)} bytes, manifest says "
                f"{entry['bytes']}): the bundle is corrupt; export it again"
            )

    def read_json(self, name: str) -> Any:
        import json

        return json.loads(self.read(name))

    def read_array(self, name: str) -> np.ndarray:
        return npy_array(self.read(name))

    def check_file(self, name: str) -> None:
        """Check file `name` against the manifest by streaming it (never all of it in memory)."""
        entry = self.manifest["files"][name]
        h, size = hashlib.sha256(), 0
        with self.fs.open(self.file_path(name), "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
                size += len(chunk)
        if size != entry["bytes"] or h.hexdigest() != entry["sha256"]:
            raise BundleError(f"bundle {self.url}: {name} fails its checksum: the bundle is corrupt; export it again")

    def copy_checked(self, name: str, local_path: str) -> str:
        """Copy file `name` to a local path, checking its checksum on the way; returns the path.

        For `--mmap`: a memory map needs a local file, and a bundle may sit on an object store.
        """
        import os

        entry = self.manifest["files"][name]
        h, size = hashlib.sha256(), 0
        os.makedirs(os.path.dirname(local_path), exist_ok=True)
        tmp = f"{local_path}.tmp"
        with self.fs.open(self.file_path(name), "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(16 << 20):
                h.update(chunk)
                size += len(chunk)
                dst.write(chunk)
        if size != entry["bytes"] or h.hexdigest() != entry["sha256"]:
            os.remove(tmp)
            raise BundleError(f"bundle {self.url}: {name} fails its checksum: the bundle is corrupt; export it again")
        os.replace(tmp, local_path)
        return local_path
