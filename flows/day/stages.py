"""The stages of a daily run, one function each: `stage(cfg, state) -> result`.

Plain functions, no Prefect: `flows.day.run.run_day` calls them in order and `flows.prefect.daily` wraps each
in a Prefect task with its retry policy.  Each takes the run config and the `DayState` the stages
before it built, and returns a frozen result whose `summary()` is the one line the run logs.

    ingest   raw logs -> events/, quarantine/             (pipeline.ingest.stage, on Dask)
    vocab    events -> vocab/                            (pipeline.vocab.stage, on Dask)
    encode   events + vocab -> features/                 (pipeline.encode.stage, on Dask)
    checks   the day's statistics vs the window's        (flows.guards.data_checks)
    warm     this node's SSD shards <- the published rows (storage.warm)
    train    features -> runs/<model>/date=D/model       (trainer.launch.torchrun: torchrun)
             after the parent's eval rows                (trainer.plan.parent_eval)
    evaluate candidate and published model on the day    (flows.guards.evaluation, trainer.eval.scoring_pass)
    publish  gate -> registry version, LATEST            (flows.guards.gate, storage.io.registry)
             -> serving bundles, prune                   (flows.serving.export, ModelRegistry.prune)

Train and publish are idempotent: the candidate and the registry version carry the run tag
(date, parent version, train identity), and a rerun finds what a killed run committed under it.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from distributed import Client

from flows.config import RunConfig, config_sources
from flows.day.preload import preloaded
from flows.day.record import recent_records
from flows.day.results import ChecksOutcome, PublishResult, TrainOutcome, WarmResult
from flows.day.state import DayState
from flows.guards.check_config import overridden
from flows.guards.checks_chart import write_checks_png
from flows.guards.data_checks import data_stats, run_checks
from flows.guards.evaluation import Evaluation, evaluate_day, gate_day
from flows.guards.leakage import Found, sample_separation
from flows.guards.pool import PastDay, unseen_dates
from flows.node.locks import data_lock
from flows.security import redacted
from flows.serving.export import point_servers_at, write_bundles
from pipeline.encode.stage import EncodeResult, encode_date
from pipeline.ingest.stage import IngestResult, ingest_date
from pipeline.schema import get_schema
from pipeline.vocab.stage import VocabResult, build_vocab
from storage.embedding.snapshot import snapshot_format
from storage.features_manifest import dense_column, key_column
from storage.io import fsio
from storage.io.dates import shift_date
from storage.io.registry import ModelRegistry
from storage.io.version import code_version
from storage.warm import WarmPlan, warm_plan_shards
from trainer.export import FIRST_EXPORT_IMPORTS
from trainer.launch.spec import TrainSpec
from trainer.launch.torchrun import TrainResult, run_training
from trainer.launch.world import resolve_world, uses_cuda, visible_gpus
from trainer.model_dir import SPARSE, read_meta, warm_start
from trainer.plan.day_recipe import day_recipe
from trainer.plan.parent_eval import ParentEval, parent_eval
from trainer.plan.recipe import Recipe
from trainer.sampling import kept_rows

log = logging.getLogger("ctrpipe")

EVICTED_FILE = "evicted.parquet"
"""The vocabulary's evicted keys (pipeline.vocab.stage)."""
WORKING_SET_FILE = "key_counts.parquet"
"""The features' train keys, hottest first (pipeline.encode.stage)."""


# ---- data stages: each holds the date's data lock (another model's run, a backfill's ingest ahead) ----
def _data_lock(cfg: RunConfig, state: DayState) -> AbstractContextManager[Any]:
    return data_lock(state.layout, state.date, cfg.publish.lock_timeout_s, log=log)


def ingest(cfg: RunConfig, state: DayState, *, client: Client) -> IngestResult:
    with _data_lock(cfg, state):
        return ingest_date(
            state.date, layout=state.layout, input=cfg.input, ingest=cfg.ingest, client=client, force=state.force
        )


def vocab(cfg: RunConfig, state: DayState, *, client: Client) -> VocabResult:
    with _data_lock(cfg, state):
        return build_vocab(
            state.date, layout=state.layout, vocab=cfg.vocab, fmt=cfg.input.format, client=client, force=state.force
        )


def encode(cfg: RunConfig, state: DayState, *, client: Client) -> EncodeResult:
    with _data_lock(cfg, state):
        return encode_date(
            state.date, layout=state.layout, encode=cfg.encode, fmt=cfg.input.format, client=client, force=state.force
        )


# ---- checks -----------------------------------------------------------------------------------
def checks(cfg: RunConfig, state: DayState) -> ChecksOutcome:
    """The data checks of the day against the completed days of the trailing window (`flows.guards.data_checks`)."""
    ing, voc, enc = state.ingest, state.vocab, state.encode
    stats = data_stats(
        rows_read=ing.rows_read,
        rows_quarantined=ing.rows_quarantined,
        rows_padded=ing.rows_padded,
        ingest_stats=ing.stats,
        day_fields=voc.day_fields,
        duplicate_share=enc.duplicate_share,
    )
    before = recent_records(state.layout, shift_date(state.date, -1), cfg.checks.window_days)
    window = [(r.date, r.data_stats) for r in before if r.completed and r.data_stats]
    report = run_checks(stats, window, cfg.checks, leakage=leakage(cfg, state))
    return ChecksOutcome(report, stats, write_checks_png(state.layout, state.date, stats, window, report))


def leakage(cfg: RunConfig, state: DayState) -> Found | None:
    """The leakage check's finding on a sample of the day's train rows (`flows.guards.leakage`); None when off."""
    if cfg.checks.action("leakage") == "off":
        return None
    schema = get_schema(cfg.input.format)
    return sample_separation(
        state.encode.url,
        dense_names={dense_column(i): name for i, name in enumerate(schema.dense)},
        key_names={key_column(j): name for j, name in enumerate(schema.categorical)},
        date=state.date,
        max_auc=cfg.checks.max_feature_auc,
        max_missing=cfg.checks.max_one_class_missing,
        storage_options=cfg.storage_options,
    )


# ---- warm -------------------------------------------------------------------------------------
def warm(cfg: RunConfig, state: DayState) -> WarmResult:
    """Plan the day's warm once and bring this node's SSD shards to the published model's rows.

    With several nodes the ranks warm their own shards (torchrun decides which node holds which
    rank), so the stage only makes the plan.
    """
    published, world = state.published, resolve_world(cfg.trainer).world_size
    vocab_files, features = state.vocab.url, state.encode.url
    plan = WarmPlan(
        date=state.date,
        world_size=world,
        sparse_optimizer=cfg.optim.sparse_optimizer,
        published_version=published.version if published else None,
        snapshot_url=fsio.join(published.url, SPARSE) if published else None,
        snapshot_tag=published.meta.run_tag if published else None,
        evict_url=fsio.join(vocab_files, EVICTED_FILE),
        working_set_url=fsio.join(features, WORKING_SET_FILE),
    )
    how = "cold: no published model"
    sources = config_sources(cfg, published.meta if published else None)
    if published:
        ws = warm_start(published.meta, cfg.model, cfg.store)
        how = f"from {published.version}" if ws.dense else f"cold dense ({ws.reason})"
        if set_here := [k for k in ws.changed if sources.get(k) == "set"]:
            how += f"; set by this config: {', '.join(set_here)} (leave them unset to keep the published values)"
        if not ws.sparse:  # rows of another width cannot be restored: the table starts empty
            plan = plan.cold()
            how += "; cold sparse (store.embedding_dim changed)"
    fmt = cfg.store.row_format(cfg.optim.sparse_optimizer)
    src = snapshot_format(plan.snapshot_url, state.layout.storage_options) if plan.snapshot_url else None
    converted_from = src.name if src is not None and src != fmt else None
    if cfg.trainer.nnodes > 1:
        return WarmResult(
            plan, "ranks", how, row_format=fmt.name, converted_from=converted_from, config_sources=sources
        )
    report = warm_plan_shards(plan, state.layout.node, list(range(world)), cfg.store, state.layout.storage_options)
    return WarmResult(
        plan,
        "flow",
        how,
        rows=report["rows"],
        seconds=report["seconds"],
        shards_restored=sum(r["restored"] for r in report["ranks"]),
        rebuilt={
            "restored_rows": sum(r.get("restored_rows", 0) for r in report["ranks"]),
            "restore_s": round(sum(r.get("restore_s", 0.0) for r in report["ranks"]), 3),
            "converted_shards": [r["converted"] for r in report["ranks"] if r.get("converted")],
        },
        row_format=fmt.name,
        converted_from=converted_from,
        config_sources=sources,
    )


# ---- train ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainPlan:
    """What the train stage runs (`spec`) and the two decisions behind it, for its record."""

    spec: TrainSpec
    recipe: Recipe
    parent_eval: ParentEval


def train_plan(cfg: RunConfig, state: DayState) -> TrainPlan:
    """The day's train spec: the features (after the parent's eval rows, `trainer.plan.parent_eval`), the warm
    plan, the model to start from, the optim values for the rows it trains (`trainer.plan.day_recipe`), and
    a run tag naming the trained result (so a rerun of the same work resumes from its checkpoints)."""
    layout, published, warmed = state.layout, state.published, state.warm
    encoded = state.encode
    world = resolve_world(cfg.trainer)
    carry = parent_eval(
        enabled=cfg.optim.train_parent_eval,
        date=state.date,
        features_url=encoded.url,
        published=published,
        evicted_url=warmed.plan.evict_url,
        storage_options=cfg.storage_options,
    )
    recipe = day_recipe(
        cfg.optim,
        cfg.model,
        cfg.store,
        rows=trained_rows(cfg, encoded, carry),
        features_url=encoded.url,
        published=published,
        world_size=world.world_size,
        storage_options=cfg.storage_options,
        device="cuda" if uses_cuda(world, visible_gpus()) else "cpu",
    )
    dense_ok = published is not None and warm_start(published.meta, cfg.model, cfg.store).dense
    spec = TrainSpec(
        features_url=encoded.url,
        output_url=layout.run_model(state.date),
        init_model_url=published.url if dense_ok and published else None,
        local_dir=layout.local_dir,
        model_name=cfg.model_name,
        storage_options=cfg.storage_options,
        store=cfg.store,
        model=recipe.model,
        optim=recipe.optim,
        het=cfg.het,
        trainer=world,
        run_tag="",
        vocab_date=state.date,
        features_id=encoded.run_id,
        checkpoint_url=layout.run_checkpoints(state.date) if cfg.trainer.checkpoint_every else None,
        warm=warmed.plan,
        carried=carry.carried,
        recipe=recipe.record(),
        config_sources=dict(warmed.config_sources),
    )
    return TrainPlan(spec.with_run_tag(state.date, published.version if published else None), recipe, carry)


def trained_rows(cfg: RunConfig, encoded: EncodeResult, carry: ParentEval) -> int:
    """The rows the day trains, the recipe's size: with a keep-rate of negatives below 1 (`trainer.sampling`), those
    it keeps of the carried eval rows and the day's train rows, in the reader's order."""
    w = cfg.optim.negative_sampling
    if w == 1.0:
        return encoded.rows_train + carry.rows
    urls = [fsio.join(carry.carried.features_url, "eval")] if carry.carried else []
    urls.append(fsio.join(encoded.url, "train"))
    return kept_rows(urls, w, seed=cfg.optim.seed, storage_options=cfg.storage_options)


def train(cfg: RunConfig, state: DayState) -> TrainOutcome:
    """Launch torchrun on the day's train rows, warm-starting from the published model.

    A candidate already committed under the same run tag (a run of the same work, stopped after
    training) is the result: it is not trained again (unless `force`).
    """
    plan = train_plan(cfg, state)
    spec = plan.spec
    result = None if state.force else committed_candidate(spec)
    if result is None:
        with preloaded(FIRST_EXPORT_IMPORTS):  # publish's first torch.export imports, loaded while the rank trains
            result = run_training(
                spec,
                work_dir=state.layout.node.work_dir(state.date),
                spec_copy_url=state.layout.run_train_spec(state.date),
            )
    parent = state.published.version if state.published else None
    return TrainOutcome(result, parent, state.warm.warm_start, spec.run_tag, plan.recipe, plan.parent_eval)


def committed_candidate(spec: TrainSpec) -> TrainResult | None:
    """The train result of the model committed at `spec.output_url` when its run tag is `spec.run_tag`, else None."""
    fs, path = fsio.get_fs(spec.output_url, spec.storage_options)
    manifest = fsio.read_manifest(fs, path)
    if manifest is None or manifest.get("run_tag") != spec.run_tag:
        return None
    return TrainResult.committed(spec.output_url, read_meta(spec.output_url, spec.storage_options))


# ---- evaluate ---------------------------------------------------------------------------------
def evaluate(cfg: RunConfig, state: DayState) -> Evaluation:
    """The candidate and the published model (loaded once) on the day's eval rows, the published one's
    next-day AUC, and the per-value AUCs of the gate's slice and GAUC fields (`flows.guards.evaluation`)."""
    fields = get_schema(cfg.input.format).categorical
    groups = {key_column(fields.index(name)): name for name in cfg.publish.group_fields()}
    return evaluate_day(
        cfg.evaluate,
        date=state.date,
        features_url=state.encode.url,
        candidate_url=state.train.result.model_url,
        published=state.published,
        storage_options=cfg.storage_options,
        groups=groups,
        publish=cfg.publish,
        pool=pool_urls(cfg, state),
    )


def pool_urls(cfg: RunConfig, state: DayState) -> dict[str, str]:
    """date -> eval rows of the earlier dates among the last `publish.pool_days` whose eval rows neither the
    candidate nor the published model trained on (`flows.guards.pool`), newest first."""
    days = cfg.publish.pool_days - 1
    before = recent_records(state.layout, shift_date(state.date, -1), days) if days else []
    past = [PastDay(r.date, str(r.status), (r.train.get("parent_eval") or {}).get("date")) for r in before]
    carried = state.train.parent_eval.carried
    dates = unseen_dates(state.date, past, carried.date if carried else None)
    return {d: fsio.join(state.layout.features(d), "eval") for d in dates if d != state.date}


# ---- publish ----------------------------------------------------------------------------------
def lineage(cfg: RunConfig, state: DayState) -> dict[str, Any]:
    """Where the version came from: dates, parent, inputs, config (credentials redacted), code."""
    ingested, trained = state.ingest, state.train
    return {
        "date": state.date,
        "dates_trained": [state.date],
        "parent_version": trained.parent_version,
        "inputs": ingested.inputs,
        "ingest": {
            "rows_read": ingested.rows_read,
            "rows_written": ingested.rows_written,
            "rows_quarantined": ingested.rows_quarantined,
            "rows_other_dates": ingested.rows_other_dates,
        },
        "vocab_date": state.date,
        "run_tag": trained.run_tag,
        "checks": [r.to_dict() for r in state.checks.report.results],
        "check_overrides": overridden(cfg.checks),
        "config": redacted(cfg.to_dict()),
        "code_version": code_version(),
    }


def publish(cfg: RunConfig, state: DayState) -> PublishResult:
    """Register the candidate as a version; move `LATEST` only when the gate passes.

    A version already registered for the candidate's run tag (a run stopped after registering it) is
    the version: it is reused, and published if the gate passes, so a rerun never adds a second one
    (unless `force`).
    """
    ev, published, trained = state.evaluation, state.published, state.train
    through = published.meta.vocab_date if published else None
    decision = gate_day(ev, cfg.publish, date=state.date, published_through=through)
    metrics = {
        "date": state.date,
        "auc": ev.new.auc,
        "logloss": ev.new.logloss,
        "rows": ev.new.rows,
        "mean_prediction": ev.new.mean_prediction,
        "click_rate": ev.new.click_rate,
        "calibration": ev.new.calibration,
        "published_auc_same_rows": ev.published.auc if ev.published else None,
        "published_logloss_same_rows": ev.published.logloss if ev.published else None,
        **({"gauc": ev.new_groups[cfg.publish.gauc_field].gauc()} if cfg.publish.gauc_field else {}),
        "gate": decision.values(),
        "gate_verdict": decision.verdict,
        "gate_evidence": decision.evidence,
    }
    registry = ModelRegistry(state.layout)
    version = None if state.force else registry.find(trained.run_tag)
    if version is None:
        version = registry.add_version(
            trained.result.model_url,
            metrics=metrics,
            lineage=lineage(cfg, state),
            run_tag=trained.run_tag,
            status="candidate" if decision.publish else "refused",
            reason="" if decision.publish else decision.reason,
        )
    bundles = None
    if decision.publish:  # bundles first: a version that cannot be served is not published
        bundles = write_bundles(state.layout, version, state.published.version if state.published else None)
        registry.publish(version)
        point_servers_at(state.layout, version)
    latest = version if decision.publish else (state.published.version if state.published else None)
    pruned = registry.prune(cfg.registry).summary()
    return PublishResult(
        decision.publish,
        version,
        decision.reason,
        latest,
        decision.values(),
        bundles,
        pruned,
        decision.verdict,
        decision.evidence,
    )
