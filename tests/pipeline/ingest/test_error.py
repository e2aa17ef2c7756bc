"""IngestError: callers branch on its kind, also after Dask shipped it from a worker."""

import pickle

from pipeline.ingest.error import IngestError


def test_the_kind_survives_pickling_as_dask_ships_errors_from_workers():
    err = pickle.loads(pickle.dumps(IngestError("day_x.tsv.gz: truncated", kind="corrupt_input")))  # noqa: S301 - its own bytes
    assert isinstance(err, IngestError) and err.kind == "corrupt_input" and str(err) == "day_x.tsv.gz: truncated"
