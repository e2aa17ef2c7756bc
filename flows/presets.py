"""Presets: named base configurations as Python functions (style rule 3), chosen by `--preset NAME`.

A preset returns a `RunConfig`; variants are a few lines on top of another
preset.  YAML files and `--set` overrides then adjust a preset's values.  (A day's
derived optim values are its recipe, `trainer.plan.recipe`: a different thing.)
"""

from __future__ import annotations

from flows.config import RunConfig, from_dict, with_overrides

PRESETS = ("default", "demo")


def default() -> RunConfig:
    """Production defaults for one day of Criteo-like logs."""
    return RunConfig()


def demo(root: str = "./demo-data") -> RunConfig:
    """The embedded default: a tiny model a 2-core machine trains in about a minute per day; its
    optimisation is derived from each day's size, as for every run (`trainer.plan.recipe`).  Its days' 300 eval
    rows cannot tell a drop of 0.02 from noise (paired standard error ~0.019), so it publishes the days the gate
    leaves undecided: the table shows them `yes, undecided`."""
    return from_dict(
        {
            "root": root,
            "ingest": {"rows_per_partition": 20_000},
            "dask": {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "2GiB"},
            "vocab": {"min_count": 3},
            "store": {"embedding_dim": 8, "host_budget_mb": 256},
            "model": {"num_heads": 2, "mlp_dims": [64, 32]},
            "publish": {"max_auc_drop": 0.02, "min_eval_rows": 100, "on_undecided": "publish"},
        }
    )


def by_name(name: str, *, root: str | None = None) -> RunConfig:
    if name == "default":
        cfg = default()
    elif name == "demo":
        cfg = demo()
    else:
        raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")
    return with_overrides(cfg, {"root": root}) if root else cfg
