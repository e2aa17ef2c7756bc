"""Every row format a user can configure, not only the contract suite's `FORMATS`: each optimizer x row dtype x
state dtype trains within its tolerance of the optimizer's oracle through a host tier spilling to SSD records,
and its snapshot returns the rows the store serves.

The contract suite runs every tier with a chosen set of formats; the tiers move stored bytes without reading
them, so this matrix runs the one path through which every format's bytes pass (the host tier, the SSD record,
the snapshot) with every combination."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from storage.embedding.row_format import ROW_DTYPES, STATE_DTYPES, RowFormat
from storage.embedding.sparse_optim import OPTIMIZERS
from tests.helpers.stores import DIM, all_rows, assert_matches_oracle, host_over_ssd

ALL = [
    RowFormat(DIM, o, r, s)
    for o, r, s in itertools.product(sorted(OPTIMIZERS), sorted(ROW_DTYPES), sorted(STATE_DTYPES))
]


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name.replace("/", "-"))
def test_every_format_trains_like_its_oracle_through_host_ssd_and_snapshot(fmt: RowFormat, tmp_path) -> None:
    store = host_over_ssd(tmp_path / "shard", rows=8, fmt=fmt)  # 8 rows in the host tier: the rest on SSD
    try:
        assert_matches_oracle(store, fmt)
        snap = all_rows(store, str(tmp_path / "s.parquet"))
        served = store.lookup(torch.from_numpy(snap["keys"])).rows.cpu().numpy()
        np.testing.assert_array_equal(snap["emb"], served)
    finally:
        store.close()
