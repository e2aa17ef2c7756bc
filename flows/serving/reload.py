"""Which bundle a server serves, and hot reload: poll the pointer, load beside, switch atomically.

`BundleSource` says where bundles are: one pinned bundle (`--model VERSION`, `--bundle URL`), or the
root's pointer `bundles/<model>/LATEST` (`--model latest`).  `Reloader.check` reads the pointer;
when it names another version, the new bundle is loaded beside the serving one and smoke-scored
(`flows.serving.model.load_model`), then `ModelHolder.current` is replaced in one assignment.
Requests in flight hold the model they started with and finish on it; the old model is freed when
the last of them lets go of it.  A bundle that fails to load or to score is refused and logged, and
the old one keeps serving; it is not tried again until its commit changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from flows.serving.bundle import BundleReader
from flows.serving.model import ServingModel, load_model
from storage.io import fsio
from storage.io.layout import Layout, validate_version

log = logging.getLogger("ctrpipe.serve")


@dataclass(frozen=True)
class BundleSource:
    """Where the served bundle comes from.

    Args:
        layout: the root (for `latest` and versions); None with a pinned `bundle_url`.
        version: `latest` (follow the pointer) or a version id (pinned).
        bundle_url: serve this bundle directory, pinned (overrides `layout` and `version`).
        mmap: serve rows memory-mapped (`--mmap`).
    """

    layout: Layout | None = None
    version: str = "latest"
    bundle_url: str | None = None
    mmap: bool = False

    def __post_init__(self) -> None:
        if self.bundle_url is None and self.layout is None:
            raise ValueError("a bundle source needs a root (layout) or a bundle URL")
        if self.version != "latest":
            validate_version(self.version)

    @property
    def follows_latest(self) -> bool:
        return self.bundle_url is None and self.version == "latest"

    def wanted(self) -> str | None:
        """The version to serve now (None: the pointer does not exist yet)."""
        if self.bundle_url is not None:
            return self.reader("").version
        if not self.follows_latest:
            return self.version
        assert self.layout is not None  # noqa: S101 - an invariant, for mypy
        fs, path = self.layout.fs(self.layout.bundle_latest())
        if not fs.exists(path):
            return None
        with fs.open(path, "r") as f:
            return validate_version(f.read().strip())

    def reader(self, version: str) -> BundleReader:
        url = self.bundle_url or self.layout.bundle(version)  # type: ignore[union-attr]
        return BundleReader(url, None if self.layout is None else self.layout.storage_options)

    def commit_id(self, version: str) -> str:
        """What identifies the committed content of a version's bundle (its `_SUCCESS.json`), or ''."""
        url = self.bundle_url or self.layout.bundle(version)  # type: ignore[union-attr]
        fs, path = fsio.get_fs(url, None if self.layout is None else self.layout.storage_options)
        manifest = fsio.read_manifest(fs, path)
        return "" if manifest is None else repr(sorted(manifest.items()))

    def mmap_dir(self, version: str) -> str | None:
        """The local folder a remote bundle's rows are copied to for `--mmap` (None without it)."""
        if not self.mmap:
            return None
        if self.layout is not None:
            return self.layout.node.serving_cache(version)
        import tempfile

        return f"{tempfile.gettempdir()}/ctrpipe-serving/{version}"

    def load(self, version: str) -> ServingModel:
        return load_model([self.reader(version)], mmap_dir=self.mmap_dir(version))


@dataclass
class ModelHolder:
    """The model being served; `current` is replaced whole, never mutated."""

    current: ServingModel | None = None
    switches: int = 0
    """Times one served version was replaced by another (the first load is not a switch)."""
    refused: dict[str, str] = field(default_factory=dict)
    """version -> the reason its bundle was refused (the latest refusal of each)."""
    refusals: int = 0
    """Bundles refused (each attempt; a refused bundle is tried again only when its commit changes)."""

    def swap(self, model: ServingModel) -> ServingModel | None:
        old, self.current = self.current, model
        self.switches += old is not None
        return old


class Reloader:
    """Loads the bundle the source names when it changes (see the module docstring).

    Args:
        source: where bundles are.
        holder: the served model.
        every_s: seconds between polls (`--reload-every`).
    """

    def __init__(self, source: BundleSource, holder: ModelHolder, *, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError(f"--reload-every must be > 0 seconds, got {every_s}")
        self.source, self.holder, self.every_s = source, holder, every_s
        self._tried: dict[str, str] = {}  # version -> commit id of the refused attempt

    def check(self) -> bool:
        """Poll once; load and switch if the pointer names a new version.  True when it switched."""
        try:
            version = self.source.wanted()
        except (OSError, ValueError) as exc:
            log.warning("cannot read the bundle pointer: %s; serving stays on %s", exc, self._serving())
            return False
        current = self.holder.current
        if version is None or (current is not None and current.version == version):
            return False
        commit = self.source.commit_id(version)
        if self._tried.get(version) == commit:
            return False  # refused before, unchanged since
        t0 = time.perf_counter()
        try:
            model = self.source.load(version)
        except Exception as exc:  # whatever stops a bundle from loading refuses it; the old one keeps serving
            self._tried[version] = commit
            self.holder.refused[version] = str(exc)
            self.holder.refusals += 1
            log.error("refused bundle %s: %s; still serving %s", version, exc, self._serving())
            return False
        old = self.holder.swap(model)
        log.info(
            "serving %s (loaded in %.2fs; was %s)", version, time.perf_counter() - t0, old.version if old else "nothing"
        )
        return True

    def _serving(self) -> str:
        return self.holder.current.version if self.holder.current else "nothing"

    async def run(self) -> None:
        """Poll every `every_s` seconds until cancelled (loads run in a thread: requests keep flowing)."""
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # never let the poller die: the next poll tries again
                log.exception("bundle reload check failed")
