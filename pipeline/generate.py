"""Synthetic Criteo-format day files with a planted click model.

Real samples are small (../shared/data); this writes days of any size with
the properties the pipeline and the model care about:

- skew: each categorical field draws value ranks from a Zipf-like law, so a
  few keys take most lookups (on real Criteo ~10% of embeddings get ~90%);
- drift: a field's head values are stable, its tail slides a little every day,
  so new values appear day by day and old ones go quiet (vocab admission and
  TTL eviction have something to do);
- missing values at per-field rates, integers with heavy tails;
- clicks drawn from a known logistic model (per-value weights of several
  fields, dense effects, one pairwise interaction), click rate ~0.25, so a
  good learner beats AUC 0.5 by a margin and `with_truth` gives the ceiling;
- with `interactions=N`, N planted pairwise field interactions (FM-style: the
  dot product of two values' latent vectors) and one three-way term on top:
  what a logistic regression on one-hot values cannot learn and a model of
  feature interactions can (`planted_interactions` says which fields);
- with `keys=N`, the large fields (`KEYED_FIELDS`) draw from N distinct values in all instead of ~0.9M (a day
  bigger than the host tier's memory), and `zipf` sets their skew: how many keys a day admits depends on both
  and on its rows, so the generator counts them (`GeneratedDay.keys`, `repeated`).

Everything is vectorised numpy and deterministic for a seed; a value's weight
and its text depend only on (seed, field, value id), never on the day or row.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from storage.io.dates import validate_date
from storage.io.fsio import get_fs, join

N_DENSE = 13
N_CATEGORICAL = 26
# Distinct values per categorical field (Criteo-like spread: 3 .. 200k).
CARDINALITY = (
    1400,
    560,
    200_000,
    80_000,
    300,
    24,
    12_000,
    630,
    3,
    40_000,
    5_000,
    150_000,
    3_000,
    27,
    14_000,
    120_000,
    10,
    4_500,
    2_100,
    4,
    160_000,
    18,
    15,
    60_000,
    90,
    45_000,
)
ZIPF_EXPONENT = 1.25
"""Rank-frequency exponent: with it the top 10% of keys take ~90% of lookups."""
HEAD_SHARE = 0.3
"""Share of a field's ranks whose value never changes; the rest slides daily."""
DAILY_SHIFT = 0.02
"""The sliding tail moves by this share of the field's cardinality per day."""
MISSING_RATE = (
    0.0,
    0.0,
    0.03,
    0.03,
    0.0,
    0.12,
    0.0,
    0.0,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.44,
    0.44,
    0.03,
    0.0,
    0.76,
    0.03,
    0.44,
    0.03,
)
DENSE_MISSING_RATE = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
DENSE_LOG_MEAN = (0.8, 2.0, 1.6, 1.5, 8.0, 3.5, 1.5, 2.3, 3.7, 0.3, 1.0, 0.3, 1.7)
# The planted model: fields with per-value weights (and their scale), dense
# effects on standardised log1p(x), one interaction between two small fields.
WEIGHTED_FIELDS = {0: 0.36, 1: 0.3, 4: 0.36, 5: 0.42, 8: 0.3, 13: 0.36, 16: 0.36, 19: 0.24, 22: 0.3, 24: 0.36}
DENSE_EFFECTS = {0: 0.21, 4: -0.15, 6: 0.18, 10: 0.15}
INTERACTION = (5, 16, 0.48)
INTERCEPT = -1.3
# With these the true probabilities reach AUC ~0.79 at a click rate ~0.24.
INTERACTION_FIELDS = (0, 1, 4, 5, 6, 7, 10, 12, 13, 14, 16, 17, 18, 21, 22, 24)
"""The fields `interactions` pairs: those of at most ~14k values, whose pairs a day of data can show."""
KEYED_FIELDS = tuple(j for j, c in enumerate(CARDINALITY) if c > 14_000)
"""The fields `keys` widens: the large ones, none weighted or paired in the click model (so AUC's ceiling stays)."""
LATENT_DIM = 4
"""Width of the values' latent vectors in the planted interactions."""
PAIR_SCALE = 0.4
"""Logit weight of one planted pair: PAIR_SCALE * <v_a, v_b>, the dot product of unit variance."""
TRIPLE_SCALE = 0.6
"""Logit weight of the three-way term: TRIPLE_SCALE * sum_k v_ak v_bk v_ck (unit variance)."""


@dataclass(frozen=True, slots=True)
class GeneratedDay:
    date: str
    path: str
    rows: int
    click_rate: float
    keys: int = 0
    """Distinct (field, value) pairs the day holds."""
    repeated: int = 0
    """Of those, the ones seen twice or more: what `vocab.min_count: 2` admits from this day alone."""


def generate_days(
    out: str,
    days: int,
    rows_per_day: int | tuple[int, ...],
    *,
    seed: int = 0,
    start_date: str = "2026-01-01",
    with_truth: bool = False,
    interactions: int = 0,
    keys: int | None = None,
    zipf: float = ZIPF_EXPONENT,
    storage_options: dict | None = None,
) -> list[GeneratedDay]:
    """Write `days` files `<out>/day_YYYY-MM-DD.tsv.gz` of `rows_per_day` rows each (or, given one
    count per day, of that day's count).

    With `with_truth`, `day_D.truth.npy` beside each file holds every row's true
    click probability (float32), the ceiling any model can reach.  `interactions`, `keys`, `zipf`:
    see `generate_day`.
    """
    counts = (rows_per_day,) * days if isinstance(rows_per_day, int) else tuple(rows_per_day)
    if days < 1 or len(counts) != days or min(counts) < 1:
        raise ValueError(
            f"days and rows_per_day must be >= 1 (one count, or one per day), got days={days}, "
            f"rows_per_day={rows_per_day}"
        )
    first = _dt.date.fromisoformat(validate_date(start_date))
    fs, base = get_fs(out, storage_options)
    fs.makedirs(base, exist_ok=True)
    result = []
    for d, rows in enumerate(counts):
        date = (first + _dt.timedelta(days=d)).isoformat()
        table, prob = generate_day(d, rows, seed=seed, interactions=interactions, keys=keys, zipf=zipf)
        path = join(out, f"day_{date}.tsv.gz")
        with (
            fs.open(join(base, f"day_{date}.tsv.gz"), "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as f,
        ):
            options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
            pacsv.write_csv(table, f, options)
        if with_truth:
            with fs.open(join(base, f"day_{date}.truth.npy"), "wb") as f:
                np.save(f, prob)
        labels = table.column("label").to_numpy()
        distinct, repeated = key_counts(table)
        result.append(
            GeneratedDay(
                date=date,
                path=path,
                rows=rows,
                click_rate=float(labels.mean()),
                keys=distinct,
                repeated=repeated,
            )
        )
    return result


def generate_day(
    day_index: int,
    rows: int,
    *,
    seed: int = 0,
    interactions: int = 0,
    keys: int | None = None,
    zipf: float = ZIPF_EXPONENT,
) -> tuple[pa.Table, np.ndarray]:
    """One day's rows as an Arrow table (label, I1..I13, C1..C26) and the true click probabilities.

    `interactions` = N > 0 adds the N pairwise terms and the three-way term of
    `planted_interactions(seed, N)` to the click model; N = 0 writes the same rows as before they existed.
    `keys` and `zipf`: the large fields' value counts and skew (`cardinalities`); the defaults write the same
    rows as before they existed.
    """
    pairs, triple = planted_interactions(seed, interactions)
    cards = cardinalities(keys)
    rng = np.random.default_rng([seed, day_index])
    ids = np.empty((N_CATEGORICAL, rows), dtype=np.int64)
    missing = np.empty((N_CATEGORICAL, rows), dtype=bool)
    for j, card in enumerate(cards):
        exponent = zipf if j in KEYED_FIELDS else ZIPF_EXPONENT
        ids[j] = value_ids(_zipf_ranks(rng, card, rows, exponent), card, day_index)
        missing[j] = rng.random(rows) < MISSING_RATE[j]
    dense = np.empty((N_DENSE, rows), dtype=np.int64)
    dense_missing = np.empty((N_DENSE, rows), dtype=bool)
    for i in range(N_DENSE):
        dense[i] = np.floor(rng.lognormal(DENSE_LOG_MEAN[i], 1.2, rows)).astype(np.int64)
        dense_missing[i] = rng.random(rows) < DENSE_MISSING_RATE[i]
    dense[1] -= 1  # like Criteo's I2, a field with -1 values

    logit = np.full(rows, INTERCEPT)
    for j, scale in WEIGHTED_FIELDS.items():
        logit += np.where(missing[j], 0.0, scale * _normal(seed, j, ids[j]))
    for i, coef in DENSE_EFFECTS.items():
        x = np.log1p(np.maximum(dense[i], 0)).astype(np.float64)
        z = (x - DENSE_LOG_MEAN[i]) / 1.2
        logit += np.where(dense_missing[i], 0.0, coef * z)
    a, b, scale = INTERACTION
    pair = ids[a] * 1_000_003 + ids[b]
    logit += np.where(missing[a] | missing[b], 0.0, scale * _normal(seed, 100 + a, pair))
    latent = {j: _latent(seed, j, ids[j]) for j in {*(f for p in pairs for f in p), *(triple or ())}}  # (rows, K)
    for a, b in pairs:
        logit += np.where(missing[a] | missing[b], 0.0, PAIR_SCALE * np.einsum("rk,rk->r", latent[a], latent[b]))
    if triple:
        a, b, c = triple
        term = np.einsum("rk,rk,rk->r", latent[a], latent[b], latent[c]) * LATENT_DIM**0.25  # unit variance
        logit += np.where(missing[a] | missing[b] | missing[c], 0.0, TRIPLE_SCALE * term)
    prob = (1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    label = (rng.random(rows) < prob).astype(np.int8)

    columns: dict[str, pa.Array] = {"label": pa.array(label)}
    for i in range(N_DENSE):
        columns[f"I{i + 1}"] = pa.array(dense[i], mask=dense_missing[i])
    for j in range(N_CATEGORICAL):
        columns[f"C{j + 1}"] = _value_text(seed, j, ids[j], missing[j])
    return pa.table(columns), prob


def cardinalities(keys: int | None) -> tuple[int, ...]:
    """Distinct values per field when all fields together draw from `keys` values (None: `CARDINALITY`): the
    large fields (`KEYED_FIELDS`) scaled by one factor, the others as they are.

    Raises:
        ValueError: `keys` leaves the large fields fewer values than they have by default.
    """
    if keys is None:
        return CARDINALITY
    fixed = sum(c for j, c in enumerate(CARDINALITY) if j not in KEYED_FIELDS)
    large = sum(CARDINALITY) - fixed
    if keys < sum(CARDINALITY):
        raise ValueError(f"keys must be >= {sum(CARDINALITY):,} (the default fields' values), got {keys:,}")
    scale = (keys - fixed) / large
    return tuple(round(c * scale) if j in KEYED_FIELDS else c for j, c in enumerate(CARDINALITY))


def key_counts(table: pa.Table) -> tuple[int, int]:
    """(distinct, seen twice or more) (field, value) pairs of a day's categorical columns."""
    distinct = repeated = 0
    for j in range(N_CATEGORICAL):
        counts = pc.value_counts(table.column(f"C{j + 1}").drop_null()).field("counts").to_numpy()
        distinct += counts.size
        repeated += int((counts >= 2).sum())
    return distinct, repeated


def planted_interactions(seed: int, n: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, int, int] | None]:
    """The `n` field pairs (0-based categorical indexes) and the three fields of the three-way term that
    `generate_day(..., interactions=n)` plants for `seed`: drawn from `INTERACTION_FIELDS` by the seed alone.

    Raises:
        ValueError: n < 0, or more pairs than `INTERACTION_FIELDS` has.
    """
    candidates = list(itertools.combinations(INTERACTION_FIELDS, 2))
    if not 0 <= n <= len(candidates):
        raise ValueError(f"interactions must be in [0, {len(candidates)}], got {n}")
    if n == 0:
        return (), None
    rng = np.random.default_rng([seed, 0x1A7E])
    pairs = tuple(candidates[i] for i in sorted(rng.choice(len(candidates), n, replace=False)))
    a, b, c = sorted(int(f) for f in rng.choice(INTERACTION_FIELDS, 3, replace=False))
    return pairs, (a, b, c)


def value_ids(ranks: np.ndarray, cardinality: int, day_index: int) -> np.ndarray:
    """The value id at popularity rank `ranks` on day `day_index`.

    Head ranks keep their value forever; tail ranks slide by DAILY_SHIFT of the
    cardinality per day, so the newest ids appear and the oldest fade out.
    """
    head = int(cardinality * HEAD_SHARE)
    shift = max(1, int(cardinality * DAILY_SHIFT)) if cardinality > 10 else 0
    return np.where(ranks < head, ranks, ranks + day_index * shift)


def _zipf_ranks(rng: np.random.Generator, cardinality: int, rows: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return np.minimum(np.searchsorted(cdf, rng.random(rows) * cdf[-1]), cardinality - 1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a stateless, well-spread hash of uint64 values."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _uniform(seed: int, stream: int, ids: np.ndarray) -> np.ndarray:
    salt = np.uint64((seed * 1_000_003 + stream) & 0xFFFFFFFF) << np.uint64(32)
    return ((_mix(ids.astype(np.uint64) ^ _mix(np.array([salt]))[0]) >> np.uint64(11)) + 0.5) / float(1 << 53)


def _normal(seed: int, field: int, ids: np.ndarray) -> np.ndarray:
    """A standard normal weight per id, fixed by (seed, field, id) (Box-Muller on two hashes)."""
    u1, u2 = _uniform(seed, 2 * field, ids), _uniform(seed, 2 * field + 1, ids)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _latent(seed: int, field: int, ids: np.ndarray) -> np.ndarray:
    """(len(ids), LATENT_DIM) latent vectors fixed by (seed, field, id); entries N(0, 1/sqrt(K)), so the dot
    product of two independent vectors has unit variance."""
    cols = [_normal(seed, 1000 + field * LATENT_DIM + k, ids) for k in range(LATENT_DIM)]
    return np.stack(cols, axis=1) * LATENT_DIM**-0.25


def _value_text(seed: int, field: int, ids: np.ndarray, missing: np.ndarray) -> pa.Array:
    """Criteo-style 8-hex-digit text of each id; only distinct ids are formatted."""
    uniques, inverse = np.unique(ids, return_inverse=True)
    codes = (_mix(uniques.astype(np.uint64) ^ np.uint64((seed << 8 | field) << 40)) >> np.uint64(32)).astype(np.uint32)
    text = pa.array(np.char.mod("%08x", codes).astype(object), pa.string())
    return pc.if_else(pa.array(missing), pa.scalar(None, pa.string()), text.take(pa.array(inverse)))
