"""One loaded bundle: the exported network, the rows, the feature spec; raw lines in, probabilities out.

The server holds a `ServingModel` per version (two while it switches).  It needs only the bundle:
`torch.export.load` for the network, the `.npy` rows, `feature_spec.json` + `admitted.npy` for
the feature path, `companion.safetensors` when the model has a companion, model.json for the
columns (`ServingMeta`: only what the scorer uses, read tolerantly, so an older scorer loads a
newer trainer's bundle; a model with a companion is a model.json version it refuses).  Scoring goes through
`trainer.eval.scoring.score_features`, the path evaluation takes, so served and evaluated scores agree.

`score_batch` scores several requests in one pass (the micro-batcher's call): their lines are
parsed and encoded together and scored in one forward pass, so the fixed cost of the feature path
(an Arrow parse, pandas frames) is paid once per batch rather than once per request.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from flows.serving.bundle import (
    ADMITTED,
    COMPANION,
    EMB,
    FEATURE_SPEC,
    KEYS,
    MODEL_JSON,
    PROGRAM,
    BundleError,
    BundleReader,
)
from flows.serving.lines import placeholder_timestamp, rows_as_lines, with_labels
from flows.serving.small import SmallBatch, fits, small_batch
from flows.serving.tables import MmapTable, chain_table, memory_table
from pipeline.encode.feature_spec import FeatureSpec, Parsed
from storage.io import records
from trainer.companion.file import from_bytes as companion_from_bytes
from trainer.companion.model import Companion, blend_weight_of
from trainer.data import FeatureSchema
from trainer.eval.metrics import PROB_EPS
from trainer.eval.scoring import score_arrays, score_features
from trainer.export import load_program
from trainer.model_dir import MODEL
from trainer.sampling import check_keep_rate
from trainer.threads import torch_threads

log = logging.getLogger("ctrpipe.serve")


@dataclass(frozen=True, kw_only=True)
class ServingMeta:
    """What the scorer reads of a bundle's model.json (a `trainer.model_dir.ModelMeta` file).

    Its own schema rather than `ModelMeta`: the scorer needs the columns and the rows' width and initial
    std, not the training configs, and every other field a newer trainer writes is ignored.
    """

    format: str = MODEL.tag
    model_name: str = ""
    dim: int
    init_std: float
    """Std of the rows of keys the model never trained (`storage.embedding.rows.initial`)."""
    fields: tuple[str, ...]
    dense_columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    bag_columns: tuple[str, ...] = ()
    model_config: dict[str, Any] = field(default_factory=dict)
    """The `model.*` values trained with, as plain data (shown, never decoded here)."""
    vocab_date: str | None = None
    run_tag: str = ""
    companion: dict[str, Any] | None = None
    """The companion's record when the model has one (its weights: the bundle's `companion.safetensors`; the
    network's blend weight: its `blend_weight`, `trainer.companion.model.blend_weight_of`)."""
    score_eps: float = PROB_EPS
    """Scores are clipped to [score_eps, 1 - score_eps]; a bundle from before it was recorded reads the default."""
    negative_sampling: float = 1.0
    """The keep-rate of negatives it trained with: logits get + log(w) (`trainer.sampling`); older bundles read 1.0."""

    def __post_init__(self) -> None:
        check_keep_rate(self.negative_sampling, "model.json negative_sampling")  # from_dict: a BundleError

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> ServingMeta:
        """Raises `BundleError` when model.json is of a version this
        code does not read or a field has the wrong type."""
        try:
            return records.read_record(cls, data, fmt=MODEL, where=where)
        except ValueError as exc:  # FormatError, ConfigError: the message names the file and the key
            raise BundleError(str(exc)) from None


@dataclass(frozen=True)
class ScoreRequest:
    """The entries of one `/v1/score` request."""

    kind: str
    """"lines" (raw log lines) or "rows" (objects of named fields: JSON objects, or CSV records with a header)."""
    items: list[Any]
    labelled: bool | None = None
    """Lines only: None: told by field count (`flows.serving.lines`); True / False: every line has / lacks the label."""
    refused: tuple[tuple[int, str], ...] = ()
    """Rows only: (index, reason) of entries refused before scoring (a CSV record of another field count)."""

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class Scored:
    """One request's answer: a probability per entry (None where refused), and why each refused one was."""

    scores: list[float | None]
    errors: list[tuple[int, str]]


class StageTimes:
    """Seconds spent per stage of scoring, summed over batches (`/metrics`, `bench.serve`'s breakdown)."""

    STAGES = ("prepare", "features", "lookup", "forward", "score")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.STAGES, 0.0)

    def timed(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, adding the seconds of every call to `stage`."""

        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds[stage] += time.perf_counter() - t0

        return call


@dataclass
class ServingModel:
    """A bundle in memory, ready to score (see the module docstring)."""

    version: str
    manifest: dict[str, Any]
    spec: FeatureSpec
    net: torch.nn.Module
    table: Any
    """`lookup(keys (N,) int64) -> (N, D) float32`: a `FrozenEmbeddings` or an `MmapTable`."""
    schema: FeatureSchema
    companion: Companion | None = None
    """The second learner blended into every score (`trainer.companion`), or None."""
    score_eps: float = PROB_EPS
    """Every score is clipped to [score_eps, 1 - score_eps] (model.json `score_eps`)."""
    keep_rate: float = 1.0
    """The network's logits get + log(keep_rate) (model.json `negative_sampling`)."""
    loaded_s: float = 0.0
    loaded_at: float = field(default_factory=time.time)
    small_path: bool = field(init=False)
    """Whether small batches of plain lines may skip the frame (`flows.serving.small`)."""

    def __post_init__(self) -> None:
        s = self.schema
        self.small_path = fits(self.spec, s.dense_columns, s.key_columns, s.bag_columns)

    def parse(self, *, lines: list[str] | None = None, rows: list[Any] | None = None) -> Parsed:
        """Lines or rows -> the training inputs (`FeatureSpec.parse_lines` / `parse_rows`)."""
        return self.spec.parse_lines(lines) if lines is not None else self.spec.parse_rows(rows or [])

    def score_features(self, features: pd.DataFrame, times: StageTimes | None = None) -> np.ndarray:
        """Click probabilities (N,) float64 of feature rows (`times`: add the lookup's and the network's seconds)."""
        if len(features) == 0:
            return np.zeros(0, np.float64)
        net: Callable[..., Any] = self.net
        lookup: Callable[..., Any] = self.table.lookup
        if times is not None:
            net, lookup = times.timed("forward", net), times.timed("lookup", lookup)
        return score_features(
            net,
            lookup,
            self.schema,
            self.spec.bag_pooling,
            features,
            companion=self.companion,
            eps=self.score_eps,
            keep_rate=self.keep_rate,
        )

    def score_small(self, batch: SmallBatch, times: StageTimes | None = None) -> np.ndarray:
        """`score_features` of a `SmallBatch`'s arrays (no frame in between)."""
        net: Callable[..., Any] = self.net
        lookup: Callable[..., Any] = self.table.lookup
        if times is not None:
            net, lookup = times.timed("forward", net), times.timed("lookup", lookup)
        return score_arrays(
            net,
            lookup,
            self.schema,
            self.spec.bag_pooling,
            batch.dense if batch.dense.shape[1] else None,
            batch.keys,
            batch.bags if self.schema.bag_columns else [],
            companion=self.companion,
            raw_all=batch.own,
            eps=self.score_eps,
            keep_rate=self.keep_rate,
        )

    def request_lines(self, request: ScoreRequest) -> tuple[list[str | None], list[tuple[int, str]]]:
        """A request's entries as labelled lines of the format (None where refused) and the refused entries' reasons."""
        if request.kind == "rows":
            return rows_as_lines(request.items, self.spec, request.refused)
        return with_labels(request.items, self.spec.schema, labelled=request.labelled)

    def score_batch(self, requests: list[ScoreRequest], times: StageTimes | None = None) -> list[Scored]:
        """Score several requests in one pass (see the module docstring); one `Scored` per request, in order."""
        times = times or StageTimes()
        t0 = time.perf_counter()
        answers = [Scored([None] * len(r), []) for r in requests]
        lines: list[str] = []
        owner: list[tuple[int, int]] = []  # (request, entry) of each line of the batch
        for k, request in enumerate(requests):
            written, answers[k].errors = self.request_lines(request)
            for i, line in enumerate(written):
                if line is not None:
                    lines.append(line)
                    owner.append((k, i))
        t1 = time.perf_counter()
        small = small_batch(lines, self.spec) if self.small_path else None
        parsed = self.spec.parse_lines(lines) if small is None else None
        t2 = time.perf_counter()
        with _threads_for(len(lines)):
            if small is not None:
                probs = self.score_small(small, times)
                index, errors = range(len(lines)), []
            else:
                assert parsed is not None  # noqa: S101 - an invariant, for mypy
                probs = self.score_features(parsed.features, times)
                index, errors = parsed.index.tolist(), parsed.errors
        times.seconds["score"] += time.perf_counter() - t2
        times.seconds["features"] += t2 - t1
        times.seconds["prepare"] += t1 - t0
        for at, p in zip(index, probs.tolist(), strict=True):
            k, i = owner[at]
            answers[k].scores[i] = p
        for at, reason in errors:
            k, i = owner[at]
            answers[k].errors.append((i, reason))
        for a in answers:
            a.errors.sort()
        return answers

    def info(self) -> dict[str, Any]:
        """What `GET /v1/model` answers."""
        m = self.manifest
        return {
            "model_version": self.version,
            "model_name": m.get("model_name"),
            "kind": m["kind"],
            "dates_trained": m.get("dates_trained", []),
            "date": m.get("date"),
            "auc": (m.get("metrics") or {}).get("auc"),
            "metrics": m.get("metrics") or {},
            "exported": m.get("exported"),
            "rows": m.get("table_rows"),
            "dtype": m.get("dtype"),
            "format": self.spec.schema.name,
            "loaded_s": round(self.loaded_s, 3),
            "mmap": isinstance(self.table, MmapTable),
        }


SERIAL_ROWS = 256
"""Batches of fewer rows run the network on one thread: for them torch's intra-op threads only add a wake-up
and a join per operator (milliseconds on a busy machine), and a bigger batch splits its work among them."""


def _threads_for(rows: int) -> AbstractContextManager[None]:
    return nullcontext() if rows >= SERIAL_ROWS else torch_threads(1)


def load_model(readers: list[BundleReader], *, mmap_dir: str | None = None) -> ServingModel:
    """Load the last bundle of `readers` (one full bundle, or a full bundle and its deltas in order).

    Args:
        readers: the bundle, or the chain ending at the version to serve.
        mmap_dir: serve the rows memory-mapped from this local folder (`--mmap`; a full bundle only):
            `rows/emb.npy` is used in place when the bundle is local, else copied there first.

    Raises:
        BundleError: a file is missing or corrupt, or the chain is broken.
    """
    t0 = time.perf_counter()
    last = readers[-1]
    meta = ServingMeta.from_dict(last.read_json(MODEL_JSON), where=f"{last.url}/{MODEL_JSON}")
    spec = FeatureSpec.from_dict(last.read_json(FEATURE_SPEC), last.read_array(ADMITTED))
    program = last.read(PROGRAM)
    try:
        net = load_program(program)
    except Exception as exc:  # torch.export.load raises many types on a bad file
        raise BundleError(f"bundle {last.url}: {PROGRAM} does not load with torch.export.load: {exc}") from exc
    table: Any  # a FrozenEmbeddings or an MmapTable
    if mmap_dir is not None:
        if len(readers) != 1:
            raise BundleError("--mmap serves a full bundle; apply a delta chain in memory")
        table = MmapTable(last.read_array(KEYS), _local_rows(last, mmap_dir), init_std=meta.init_std)
    else:
        table = memory_table(chain_table(readers), init_std=meta.init_std)
    schema = FeatureSchema(
        dense_columns=meta.dense_columns, key_columns=meta.key_columns, fields=meta.fields, bag_columns=meta.bag_columns
    ).for_pooling(spec.bag_pooling)
    second = None
    if meta.companion:
        try:
            weight = blend_weight_of(meta.companion, f"{last.url}/{MODEL_JSON}")
            second = companion_from_bytes(last.read(COMPANION), f"{last.url}/{COMPANION}", blend_weight=weight)
        except ValueError as exc:
            raise BundleError(str(exc)) from None
    model = ServingModel(
        version=last.version,
        manifest=last.manifest,
        spec=spec,
        net=net,
        table=table,
        schema=schema,
        companion=second,
        score_eps=meta.score_eps,
        keep_rate=meta.negative_sampling,
        loaded_s=time.perf_counter() - t0,
    )
    smoke_check(model)
    return model


def _local_rows(reader: BundleReader, mmap_dir: str) -> str:
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(reader.fs, LocalFileSystem):
        reader.check_file(EMB)
        return reader.file_path(EMB)
    return reader.copy_checked(EMB, f"{mmap_dir.rstrip('/')}/{EMB}")


def smoke_check(model: ServingModel) -> None:
    """Score one line of all-missing values (and the label): a finite probability, or the bundle is refused.

    Raises:
        BundleError: the line does not parse or the network returns no probability in [0, 1].
    """
    s = model.spec.schema
    values = ["" for _ in s.columns]
    values[s.columns.index(s.label)] = s.label_negative[0]
    if s.timestamp is not None:
        values[s.columns.index(s.timestamp)] = placeholder_timestamp(s)
    parsed = model.parse(lines=[s.separator.join(values)])
    if parsed.errors:
        raise BundleError(f"bundle {model.version}: smoke line refused: {parsed.errors[0][1]}")
    try:
        p = model.score_features(parsed.features)
    except Exception as exc:
        raise BundleError(f"bundle {model.version}: smoke score failed: {type(exc).__name__}: {exc}") from exc
    if p.shape != (1,) or not math.isfinite(float(p[0])) or not 0.0 < float(p[0]) < 1.0:
        raise BundleError(f"bundle {model.version}: smoke score gave {p!r}, not one probability")
