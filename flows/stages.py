"""Stage logic that spans packages: warm, train, evaluate, the publish gate, the day's record.

Plain functions, no Prefect: `flows/tasks.py` wraps them, tests call them directly.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flows.config import RunConfig
from storage import fsio
from storage.registry import ModelRegistry
from trainer.config import PublishConfig


class PublishRefused(RuntimeError):
    """The publish gate refused the day's model; `LATEST` was left alone."""


def run_dir(cfg: RunConfig, date: str) -> str:
    return fsio.join(cfg.root, "runs", f"date={fsio.validate_date(date)}")


def feature_dir(cfg: RunConfig, date: str) -> str:
    return fsio.join(cfg.root, "features", f"date={fsio.validate_date(date)}")


def feature_data(cfg: RunConfig, date: str) -> str:
    """The files of the committed features of `date` (`fsio.data_url`: an object store's data prefix)."""
    return fsio.data_url(feature_dir(cfg, date), cfg.storage_options)


def local_dir(cfg: RunConfig) -> str:
    """Node-local folder of the SSD tier: configured, else beside a local root, else a user cache folder."""
    if cfg.store.local_dir:
        return str(fsio.local_path(cfg.store.local_dir))
    if fsio.is_local(cfg.root):
        return str(fsio.local_path(cfg.root).resolve() / "_local")
    digest = hashlib.sha256(cfg.root.encode()).hexdigest()[:12]
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctr-pipeline" / digest)


def registry(cfg: RunConfig) -> ModelRegistry:
    return ModelRegistry(cfg.root, cfg.model_name, cfg.storage_options)


# ---- warm -----------------------------------------------------------------------------------
def warm_plan(cfg: RunConfig, date: str) -> dict[str, Any]:
    """What warming a shard for `date` needs: the published snapshot, the evictions, the working set.

    The same plan drives the flow's warm stage and, on nodes the flow does not
    run on, each rank's own warm (`trainer.warmup`); the token tells a rank
    whether its shard was already warmed for this plan.
    """
    from trainer.warmup import warm_token

    reg = registry(cfg)
    latest = reg.latest()
    snapshot_url = tag = None
    if latest is not None:
        snapshot_url = fsio.join(reg.url(latest), "sparse")
        tag = reg.read_json(latest, "model.json").get("run_tag")
    world = cfg.trainer.nnodes * cfg.trainer.nproc_per_node
    return {
        "published_version": latest,
        "snapshot_url": snapshot_url,
        "snapshot_tag": tag,
        "evict_url": fsio.join(fsio.data_url(fsio.join(cfg.root, "vocab", f"date={date}"), cfg.storage_options),
                               "evicted.parquet"),
        "working_set_url": fsio.join(feature_data(cfg, date), "key_counts.parquet"),
        "token": warm_token(date, latest, world),
    }


def warm_stage(cfg: RunConfig, date: str) -> dict[str, Any]:
    """Bring this node's SSD shards to the published model's state and write each rank's working set.

    With several nodes the ranks warm their own shards (torchrun decides which
    node holds which rank), so the stage only records the plan.
    """
    from storage.tiered import shard_dir_for
    from storage.warm import warm_shards
    from trainer.warmup import mark_warm, read_keys

    plan = warm_plan(cfg, date)
    if cfg.trainer.nnodes > 1:
        return {**plan, "warmed_by": "ranks"}
    world = cfg.trainer.nproc_per_node
    report = warm_shards(
        local_dir=local_dir(cfg),
        model_name=cfg.model_name,
        world_size=world,
        ranks=list(range(world)),
        store=cfg.store,
        snapshot_url=plan["snapshot_url"],
        snapshot_tag=plan["snapshot_tag"],
        evict_keys=read_keys(plan["evict_url"], cfg.storage_options),
        working_set=read_keys(plan["working_set_url"], cfg.storage_options),
        storage_options=cfg.storage_options,
    )
    for rank in range(world):
        mark_warm(shard_dir_for(local_dir(cfg), cfg.model_name, rank, world), plan["token"])
    report["published_version"] = plan["published_version"]
    report["warmed_by"] = "flow"
    return report


# ---- train ----------------------------------------------------------------------------------
def train_stage(cfg: RunConfig, date: str, *, vocab_date: str | None = None) -> dict[str, Any]:
    """Launch torchrun on the day's train rows, warm-starting from the published model.

    The run tag is a function of the date, the published parent and the
    config, so a rerun of the same work resumes from its checkpoints and every
    node of a multi-node job derives the same rendezvous id.
    """
    from trainer.launch import run_training

    plan = warm_plan(cfg, date)
    latest = plan["published_version"]
    init_from, warm_start = None, "cold: no published model"
    if latest:
        ok_dense, ok_sparse, why = warm_start_compatible(registry(cfg).read_json(latest, "model.json"), cfg)
        init_from = latest if ok_dense else None
        warm_start = f"from {latest}" if ok_dense else f"cold dense ({why})"
        if not ok_sparse:  # rows of another width cannot be restored: the table starts empty
            plan = {**plan, "snapshot_url": None, "snapshot_tag": None}
            warm_start += "; cold sparse (store.embedding_dim changed)"
    digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:10]
    run_tag = f"{date}:{latest or 'none'}:{digest}"
    work_dir = Path(local_dir(cfg)) / "runs" / date
    work_dir.mkdir(parents=True, exist_ok=True)
    result = run_training(
        features_url=feature_data(cfg, date),  # resolved once: every rank and restart reads the same files
        output_url=fsio.join(run_dir(cfg, date), "model"),
        init_model_url=registry(cfg).url(init_from) if init_from else None,
        local_dir=local_dir(cfg),
        model_name=cfg.model_name,
        store=cfg.store,
        model=cfg.model,
        trainer=cfg.trainer,
        run_tag=run_tag,
        vocab_date=vocab_date or date,
        storage_options=cfg.storage_options,
        work_dir=str(work_dir),
        warm=plan,
        spec_copy_url=fsio.join(run_dir(cfg, date), "train-spec.json"),
    )
    out = asdict(result) if hasattr(result, "__dataclass_fields__") else dict(result)
    out["parent_version"] = latest
    out["warm_start"] = warm_start
    return out


SHAPE_FREE = ("dropout", "bag_pooling")
"""ModelConfig fields that change no parameter shape: a change keeps the warm start."""


def warm_start_compatible(meta: dict[str, Any], cfg: RunConfig) -> tuple[bool, bool, str]:
    """Can today's config start from the published model?  (dense ok, sparse ok, why not).

    A config change that reshapes the network (another arch, MLP widths, dense
    buckets, ...) or the rows (embedding_dim) must not fail every daily run until
    someone intervenes: the affected part starts cold, and the record says so.
    Dropout and bag pooling reshape nothing and are ignored (a model from before
    `model.bag_pooling` existed warm-starts a run that pools bags).
    """
    ours = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg.model).items() if k not in SHAPE_FREE}
    theirs = {k: v for k, v in (meta.get("model_config") or {}).items() if k not in SHAPE_FREE}
    sparse_ok = meta.get("dim") == cfg.store.embedding_dim
    changed = [f"model.{k}" for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
    if not sparse_ok:
        changed.append("store.embedding_dim")
    if changed:
        return False, sparse_ok, "architecture changed: " + ", ".join(changed)
    return True, True, ""


# ---- evaluate -------------------------------------------------------------------------------
def evaluate_stage(cfg: RunConfig, date: str) -> dict[str, Any]:
    """AUC/logloss of the day's candidate and of the published model on the same eval rows."""
    from trainer.evaluate import evaluate_model

    features = feature_data(cfg, date)
    eval_url = fsio.join(features, "eval")
    so = cfg.storage_options
    new = evaluate_model(fsio.join(run_dir(cfg, date), "model"), eval_url, storage_options=so)
    reg = registry(cfg)
    latest = reg.latest()
    published = next_day = None
    if latest:
        published = evaluate_model(reg.url(latest), eval_url, storage_options=so)
        # Next-day evaluation: the published model was trained through the previous day and has
        # not seen any of today's rows, so its score on today's train split is what production saw.
        next_day = evaluate_model(reg.url(latest), fsio.join(features, "train"), storage_options=so)
    return {"new": new, "published": published, "published_version": latest, "next_day": next_day}


def gate(new: dict[str, Any], published: dict[str, Any] | None, cfg: PublishConfig) -> tuple[bool, str]:
    """Decide whether the candidate may replace the published model; the reason is recorded either way."""
    auc, loss = new.get("auc"), new.get("logloss")
    if auc is None or loss is None or not (math.isfinite(auc) and math.isfinite(loss)):
        return False, f"candidate metrics are not finite (auc={auc}, logloss={loss})"
    if new.get("rows", 0) < cfg.min_eval_rows:
        return False, f"eval set has {new.get('rows', 0)} rows, fewer than publish.min_eval_rows={cfg.min_eval_rows}"
    if published is None:
        return True, "first model"
    drop = published["auc"] - auc
    if drop > cfg.max_auc_drop:
        return False, (
            f"AUC {auc:.4f} is {drop:.4f} below the published model's {published['auc']:.4f} on the same rows "
            f"(publish.max_auc_drop={cfg.max_auc_drop})"
        )
    return True, f"AUC {auc:.4f} vs published {published['auc']:.4f}"


# ---- publish --------------------------------------------------------------------------------
def publish_stage(cfg: RunConfig, date: str, evaluation: dict[str, Any], lineage: dict[str, Any]) -> dict[str, Any]:
    """Register the candidate as a version; move `LATEST` only when the gate passes."""
    ok, reason = gate(evaluation["new"], evaluation["published"], cfg.publish)
    reg = registry(cfg)
    metrics = {
        "date": date,
        **{k: evaluation["new"].get(k) for k in ("auc", "logloss", "rows", "mean_prediction", "click_rate")},
        "published_auc_same_rows": (evaluation["published"] or {}).get("auc"),
    }
    version = reg.add_version(
        fsio.join(run_dir(cfg, date), "model"),
        metrics=metrics,
        lineage=lineage,
        status="candidate" if ok else "refused",
        reason="" if ok else reason,
    )
    if ok:
        reg.publish(version)
    return {"published": ok, "version": version, "reason": reason, "latest": reg.latest()}


# ---- the day's record -----------------------------------------------------------------------
@dataclass(frozen=True)
class DayRecord:
    """`<root>/runs/date=D/metrics.json`: what one daily run did."""

    date: str
    completed: bool
    status: str  # published | refused | failed
    reason: str
    auc: float | None
    logloss: float | None
    published_auc: float | None
    next_day_auc: float | None
    """AUC of the previously published model on this day's train rows (unseen by it): what production saw."""
    rows_read: int
    rows_ingested: int
    rows_quarantined: int
    vocab_size: int
    rows_train: int
    rows_eval: int
    published: bool
    model_version: str | None
    latest_version: str | None
    parent_version: str | None
    train: dict[str, Any]
    warm: dict[str, Any]
    seconds: dict[str, float]


def write_record(cfg: RunConfig, record: DayRecord) -> None:
    fs, path = fsio.get_fs(run_dir(cfg, record.date), cfg.storage_options)
    fs.makedirs(path, exist_ok=True)
    fsio.write_text_atomic(fs, f"{path}/metrics.json", json.dumps(asdict(record), indent=2, default=str))


def read_record(cfg: RunConfig, date: str) -> dict[str, Any] | None:
    fs, path = fsio.get_fs(run_dir(cfg, date), cfg.storage_options)
    target = f"{path}/metrics.json"
    return fsio.read_json(fs, target) if fs.exists(target) else None


def is_completed(cfg: RunConfig, date: str) -> bool:
    record = read_record(cfg, date)
    return bool(record and record.get("completed"))


def recent_records(cfg: RunConfig, date: str, days: int) -> list[dict[str, Any]]:
    """Records of the `days` dates ending at `date` that have one, oldest first."""
    dates = fsio.date_range(fsio.shift_date(date, -(days - 1)), date)
    return [r for d in dates if (r := read_record(cfg, d))]


def resolve_date(date: str | None, scheduled: Any) -> str:
    """The date a run processes: the given one, else the day before the run's *scheduled* time.

    A scheduled run that starts late (a busy worker, an outage) still processes
    the day it was scheduled for, not the day the wall clock says.
    """
    if date:
        return fsio.validate_date(date)
    import datetime as _dt

    when = scheduled if scheduled is not None else _dt.datetime.now(_dt.UTC)
    return (when.date() - _dt.timedelta(days=1)).isoformat()


_SECRET_WORDS = {"key", "secret", "token", "password", "passwd", "credential", "credentials", "auth", "apikey"}


def _secret_like(name: Any) -> bool:
    tokens = str(name).lower().replace("-", "_").split("_")
    return any(t in _SECRET_WORDS for t in tokens)


def redacted(obj: Any) -> Any:
    """A copy of a config dict with every value under a credential-like key (`aws_secret_access_key`,
    `token`, `key`, ...) replaced by '***', for lineage and logs."""
    if isinstance(obj, dict):
        return {k: ("***" if _secret_like(k) and v not in (None, "", {}) else redacted(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(redacted(v) for v in obj)
    return obj
