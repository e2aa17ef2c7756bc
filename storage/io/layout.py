"""Where everything lives: the one object that spells every path under a storage root.

    <root>/raw/                                 demo input (`ctrpipe generate`, `ctrpipe demo`)
    <root>/events/date=D/                       typed rows of the day (ingest)
    <root>/quarantine/date=D/                   malformed rows with file, line and reason (ingest)
    <root>/vocab[/<vocab_key>]/date=D/          the feature vocabulary after day D (vocab)
    <root>/features[/<features_key>]/date=D/{train,eval}/   encoded rows (encode)
    <root>/runs/<model>/date=D/                 the model's run of the day: metrics.json, history.png,
                                                checks.png, train-spec.json, model/ (the candidate) and
                                                model.checkpoint/
    <root>/models/<model>/vNNNNN/               registry versions
    <root>/models/<model>/LATEST                the published version
    <root>/bundles/<model>/vNNNNN/              the serving bundle of a published version (flows.serving)
    <root>/bundles/<model>/deltas/vNNNNN-from-vMMMMM/  its rows changed since vMMMMM (a delta bundle)
    <root>/bundles/<model>/LATEST               the version whose bundle servers load (moved after the bundle commit)
    <root>/models/<model>/slot-holder.json      who holds the model's train/publish slot (Prefect server mode)
    <root>/metrics/<model>.prom                 the model's last daily run, Prometheus textfile (flows.metrics)
    <local_dir>/<model>/shard-RRRRR-of-WWWWW/   the SSD tier of rank R (node-local)
    <local_dir>/<model>/slot.lock               the node's train/publish slot (a kernel file lock; its holder)
    <local_dir>/<model>/days/date=D.lock        one run of the model's date at a time on this node (a kernel lock)
    <local_dir>/data/date=D.lock                one writer of the date's data stages at a time on this node
    <local_dir>/runs/D/                         the launcher's scratch (train spec) on this node
    <local_dir>/<model>/serving/vNNNNN/         a bundle's rows copied for `score-server --mmap` on this node

A stage asks the layout for its directories and never formats `date=...` itself, so a change of
layout is one edit here.  Several models share one root: events and quarantine depend only on the
input and are shared; a vocabulary and features are shared by the models whose configs of them are
equal (`vocab_key` / `features_key`, digests of those configs: `flows.config.RunConfig.layout`);
runs and the registry are the model's own.  Dates, model names and versions are validated once, here, before they
become paths.  File names *inside* a committed directory belong to the stage that writes it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from storage.io import fsio
from storage.io.dates import validate_date

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Model names become folder names."""
VERSION = re.compile(r"^v\d{5}$")
"""Registry version ids: `v` and five digits, in creation order."""
_DATED = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
_KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
"""Config keys of vocabularies and features (digests) become folder names."""
_DELTA = re.compile(r"^(v\d{5})-from-(v\d{5})$")


def validate_model_name(name: str) -> str:
    """Return `name` if it is a plain folder name ([A-Za-z0-9._-], at most 64 characters)."""
    if not isinstance(name, str) or not MODEL_NAME.match(name):
        raise ValueError(f"model_name must match {MODEL_NAME.pattern} (it becomes a folder name), got {name!r}")
    return name


def validate_version(version: str) -> str:
    """Versions become paths: only `vNNNNN` is accepted (no `..`, no absolute paths)."""
    if not isinstance(version, str) or not VERSION.match(version):
        raise ValueError(f"model version must look like v00001, got {version!r}")
    return version


def dated_name(date: str) -> str:
    """The folder name of one date's output: `date=YYYY-MM-DD`."""
    return f"date={validate_date(date)}"


def date_of(folder_name: str) -> str | None:
    """The date a `date=YYYY-MM-DD` folder name holds, or None for any other name."""
    m = _DATED.match(folder_name.rstrip("/").rsplit("/", 1)[-1])
    return m.group(1) if m else None


def delta_versions(folder_name: str) -> tuple[str, str] | None:
    """(target, base) of a delta bundle folder name `vNNNNN-from-vMMMMM`, or None for any other name."""
    m = _DELTA.match(folder_name.rstrip("/").rsplit("/", 1)[-1])
    return (m.group(1), m.group(2)) if m else None


def root_digest(root: str) -> str:
    """12 hex digits naming a storage root (a local one by its absolute path), for names kept outside it."""
    key = str(fsio.local_path(root).resolve()) if fsio.is_local(root) else root.rstrip("/")
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def default_local_dir(root: str) -> str:
    """Node-local folder of the SSD tier when none is configured.

    `<root>/_local` for a local root; for an object-store root a folder under the user's cache
    directory named by a digest of the root, so two roots never share shards.
    """
    if fsio.is_local(root):
        return str(fsio.local_path(root).resolve() / "_local")
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctr-pipeline" / root_digest(root))


@dataclass(frozen=True)
class NodeLayout:
    """The node-local paths of one model: its SSD shards and the launcher's scratch.

    Args:
        local_dir: the node-local folder (direct I/O needs a local filesystem).
        model_name: the model whose shards these are.
    """

    local_dir: str
    model_name: str

    def __post_init__(self) -> None:
        validate_model_name(self.model_name)
        if not self.local_dir or not fsio.is_local(self.local_dir):
            raise ValueError(f"the node-local folder must be a local path (direct I/O), got {self.local_dir!r}")
        object.__setattr__(self, "local_dir", str(fsio.local_path(self.local_dir)))

    def shard(self, rank: int, world_size: int) -> str:
        """The SSD directory of rank `rank` of a `world_size`-rank job (owner of key k: k % world)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
        return str(Path(self.local_dir) / self.model_name / f"shard-{rank:05d}-of-{world_size:05d}")

    def work_dir(self, date: str) -> str:
        """The launcher's scratch folder for the day on this node (the spec file torchrun reads)."""
        return str(Path(self.local_dir) / "runs" / validate_date(date))

    def serving_cache(self, version: str) -> str:
        """Where `score-server --mmap` copies a remote bundle's rows (memory maps need local files)."""
        return str(Path(self.local_dir) / self.model_name / "serving" / validate_version(version))

    def slot_lock(self) -> str:
        """The file whose kernel lock is the model's train/publish slot on this node (`flows.node.locks`).

        Beside the shards it guards: runs that would share them wait for each other, and the default
        node-local folder is per root, so runs on unrelated roots never do.
        """
        return str(Path(self.local_dir) / self.model_name / "slot.lock")

    def day_lock(self, date: str) -> str:
        """The file whose kernel lock keeps two runs of the model's `date` apart on this node (`flows.node.locks`)."""
        return str(Path(self.local_dir) / self.model_name / "days" / f"{dated_name(date)}.lock")

    def data_lock(self, date: str) -> str:
        """The file whose kernel lock keeps two writers of `date`'s data stages apart on this node, whatever the
        model (events are shared by the models of a root: `flows.node.locks.data_lock`)."""
        return str(Path(self.local_dir) / "data" / f"{dated_name(date)}.lock")


@dataclass(frozen=True)
class Layout:
    """Paths of one model's outputs under `root` (URLs, with the root's protocol) and on this node.

    Args:
        root: the storage root: a local folder or an fsspec URL.
        model_name: the model whose runs, registry and shards these are.
        storage_options: fsspec options for the root (credentials come from the environment).
        local_dir: node-local folder of the SSD tier; empty = `default_local_dir(root)`.
        vocab_key: names the vocabulary's config (`vocab/<key>/date=D`); empty = `vocab/date=D`.
        features_key: names the features' config (`features/<key>/date=D`); empty = `features/date=D`.

    Example::

        layout = Layout("s3://bucket/ctr", "ctr")
        layout.events("2026-01-05")       # 's3://bucket/ctr/events/date=2026-01-05'
        layout.run("2026-01-05")          # 's3://bucket/ctr/runs/ctr/date=2026-01-05'
        layout.version("v00003")          # 's3://bucket/ctr/models/ctr/v00003'
    """

    root: str
    model_name: str = "ctr"
    storage_options: dict[str, Any] | None = None
    local_dir: str = ""
    vocab_key: str = ""
    features_key: str = ""

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("root must not be empty")
        validate_model_name(self.model_name)
        for name in ("vocab_key", "features_key"):
            key = getattr(self, name)
            if key and not _KEY.match(key):
                raise ValueError(f"{name} must match {_KEY.pattern} (it becomes a folder name), got {key!r}")
        object.__setattr__(self, "root", self.root.rstrip("/") or "/")
        object.__setattr__(
            self, "local_dir", NodeLayout(self.local_dir or default_local_dir(self.root), self.model_name).local_dir
        )

    def _under(self, *parts: str) -> str:
        return fsio.join(self.root, *parts)

    def fs(self, url: str | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
        """The root's filesystem and the protocol-less path of `url` (default: the root) on it."""
        return fsio.get_fs(url or self.root, self.storage_options)

    # ---- input ---------------------------------------------------------------------------------
    def raw(self) -> str:
        """The demo's raw day files (`day_YYYY-MM-DD.tsv.gz`)."""
        return self._under("raw")

    # ---- data stages (events: shared by every model on the root; vocab, features: per config) -------
    def events(self, date: str) -> str:
        return self._under("events", dated_name(date))

    def quarantine(self, date: str) -> str:
        return self._under("quarantine", dated_name(date))

    def vocab(self, date: str) -> str:
        return fsio.join(self.vocab_parent(), dated_name(date))

    def vocab_parent(self) -> str:
        """The folder holding every `date=D` vocabulary of this config (listed to find the previous one)."""
        return self._under("vocab", *([self.vocab_key] if self.vocab_key else []))

    def features(self, date: str) -> str:
        return self._under("features", *([self.features_key] if self.features_key else []), dated_name(date))

    # ---- the model's run of the day --------------------------------------------------------------
    def run(self, date: str) -> str:
        return self._under("runs", self.model_name, dated_name(date))

    def run_record(self, date: str) -> str:
        """`metrics.json`: what the day's run did."""
        return fsio.join(self.run(date), "metrics.json")

    def run_history(self, date: str) -> str:
        """`history.png`: AUC and logloss over the last days."""
        return fsio.join(self.run(date), "history.png")

    def run_model(self, date: str) -> str:
        """The day's candidate model directory (committed by rank 0)."""
        return fsio.join(self.run(date), "model")

    def run_checkpoints(self, date: str) -> str:
        """The training checkpoints of the day's run (shared by every node; deleted after the commit)."""
        return fsio.join(self.run(date), "model.checkpoint")

    def run_checks_chart(self, date: str) -> str:
        """`checks.png`: the data checks' series over their window, the day marked."""
        return fsio.join(self.run(date), "checks.png")

    def metrics_textfile(self) -> str:
        """`metrics/<model>.prom`: the model's last daily run for node-exporter's textfile collector
        (`flows.metrics.textfile`)."""
        return self._under("metrics", f"{self.model_name}.prom")

    def run_train_spec(self, date: str) -> str:
        """A copy of the train spec on shared storage, for jobs that start torchrun themselves."""
        return fsio.join(self.run(date), "train-spec.json")

    # ---- the registry ----------------------------------------------------------------------------
    def models(self) -> str:
        return self._under("models", self.model_name)

    def version(self, version: str) -> str:
        return fsio.join(self.models(), validate_version(version))

    def latest_pointer(self) -> str:
        return fsio.join(self.models(), "LATEST")

    # ---- serving bundles -------------------------------------------------------------------------
    def bundles(self) -> str:
        return self._under("bundles", self.model_name)

    def bundle(self, version: str) -> str:
        """The full serving bundle of a version (`flows.serving.bundle`)."""
        return fsio.join(self.bundles(), validate_version(version))

    def bundle_deltas(self) -> str:
        """The folder of the delta bundles (`delta_versions` parses their names)."""
        return fsio.join(self.bundles(), "deltas")

    def bundle_delta(self, version: str, base: str) -> str:
        """The delta bundle taking the rows of `base` to those of `version`."""
        return fsio.join(self.bundle_deltas(), f"{validate_version(version)}-from-{validate_version(base)}")

    def bundle_latest(self) -> str:
        """The version servers load; moved only once its bundle is committed."""
        return fsio.join(self.bundles(), "LATEST")

    def slot_holder(self) -> str:
        """Who holds the model's Prefect train/publish slot (host, pid, flow run, since): read by waiting runs."""
        return fsio.join(self.models(), "slot-holder.json")

    # ---- this node -------------------------------------------------------------------------------
    @property
    def node(self) -> NodeLayout:
        """This node's folder of the model's SSD shards and scratch."""
        return NodeLayout(self.local_dir, self.model_name)
