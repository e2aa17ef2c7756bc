"""The optim values a day trains with: `day_recipe(optim, model, store, rows=..., features_url=..., published=...)`.

`trainer.plan.recipe.derive` sizes them to the day's rows.  A small day's `sparse_lr` then comes from its
data (`trainer.plan.sparse_lr_search`), and how depends on where the embedding rows start:

- from zero (no published model, or one whose rows cannot be restored): the search cross-validates
  a logistic regression trained from zero on the day's train rows, which is this day's situation;
- from the published model: the search would answer for rows starting at zero and asks for too
  large a step (on the demo's warm-started days that cost AUC), so the day keeps the factor over the rule's
  value that its model's first searched day chose.

Days over `MAX_ROWS` train rows, a `sparse_lr` set in the config, and a sparse optimizer other than those of
`SEARCHED`, keep what `derive` gives.  The search's proxy was validated against the product with Adam; with
row-wise AdaGrad it picks the largest candidate where the product does best at the derived value (a sweep on
the Criteo sample), so AdaGrad rows keep the derived value.  The row-wise
Adams are Adam on the proxy's one-value-per-key rows, so they are searched as Adam is.
"""

from __future__ import annotations

from typing import Any

from storage.embedding.config import StoreConfig
from storage.embedding.rows.sparse_optim import OPTIMIZERS, SparseAdam
from trainer.config import OptimConfig
from trainer.data import RankReader, read_schema, split_dir
from trainer.model_dir import warm_start
from trainer.models.config import ModelConfig
from trainer.plan.published import Published
from trainer.plan.recipe import Recipe, derive
from trainer.plan.sparse_lr_search import MAX_ROWS, choose_sparse_lr

KEY = "optim.sparse_lr"
SEARCHED = tuple(name for name, rule in OPTIMIZERS.items() if isinstance(rule, SparseAdam))
"""Sparse optimizers whose small-day `sparse_lr` is searched (see the module docstring)."""


def day_recipe(
    optim: OptimConfig,
    model: ModelConfig,
    store: StoreConfig,
    *,
    rows: int,
    features_url: str,
    published: Published | None,
    world_size: int,
    storage_options: dict[str, Any] | None = None,
    device: str = "cpu",
) -> Recipe:
    """The day's recipe (see the module docstring) for ranks computing on `device` ("cpu" or "cuda").  Reads
    the day's train rows only for a small day whose rows start from zero."""
    recipe = derive(optim, model, rows=rows, world_size=world_size, device=device)
    if KEY not in recipe.derived or recipe.rows > MAX_ROWS or optim.sparse_optimizer not in SEARCHED:
        return recipe
    if published is not None and warm_start(published.meta, model, store).sparse:
        return inherited(recipe, published.meta.recipe, published.version)
    return searched(recipe, features_url, storage_options)


def searched(recipe: Recipe, features_url: str, storage_options: dict[str, Any] | None) -> Recipe:
    """`recipe` with `sparse_lr` chosen by cross-validation on the day's train rows."""
    schema = read_schema(features_url, storage_options).for_pooling("none")
    reader = RankReader(
        split_dir(features_url, "train"),
        schema,
        rank=0,
        world_size=1,
        batch_size=int(recipe.optim.batch_size),
        storage_options=storage_options,
        keep_rate=recipe.optim.negative_sampling,  # the rows the day trains
        seed=recipe.optim.seed,
    )
    choice = choose_sparse_lr(*reader.arrays(), optim=recipe.optim)
    return recipe.with_value(KEY, choice.lr, choice.reason())


def inherited(recipe: Recipe, parent: dict[str, Any], version: str) -> Recipe:
    """`recipe` with the searched factor of the published model's recipe (`parent`, its model.json
    record) applied to the rule's `sparse_lr`; unchanged when that model's value was not searched."""
    factor = (parent.get("searched") or {}).get(KEY)
    if factor is None:
        return recipe
    value = float(f"{recipe.optim.sparse_lr * factor:.3g}")
    return recipe.with_value(
        KEY,
        value,
        f"{factor:g} x the rule's {recipe.optim.sparse_lr:g}: the factor searched "
        f"for the rows this day starts from ({version})",
    )
