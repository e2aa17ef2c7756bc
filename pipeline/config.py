"""Typed configuration of the data stages (input, ingest, vocab, encode, Dask).

Each section is a frozen dataclass validated on construction; `flows.config`
assembles them from YAML and names the offending key on any error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FORMATS = ("criteo", "avazu")
_SCHEDULER_ADDRESS = re.compile(
    r"^((tcp|tls|ws|wss|ucx)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}/?$|^inproc://\S+$"
)
"""A Dask scheduler address: [protocol://]host:port (what `distributed.Client` connects to)."""
_SIZE = re.compile(r"^\d+(\.\d+)?\s*([kMGTP]i?B|[kKMGTP]|B)?$", re.IGNORECASE)
"""A byte size as `dask.utils.parse_bytes` reads it: 4GiB, 512MB, 2 GB, 1000 (bytes)."""
SCHEMA_FILE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, kw_only=True, slots=True)
class InputConfig:
    url: str = ""
    """Where the raw logs for a date are. A path or fsspec URL with `{date}`
    (YYYY-MM-DD) or `{yyyymmdd}` placeholders, a glob, or a single file whose
    rows carry a timestamp (Avazu's `hour`). Empty: `<root>/raw/day_{date}.tsv.gz`."""
    format: str = "criteo"
    """Log format: `criteo` (TSV: label, I1..I13, C1..C26), `avazu` (CSV with header), or the
    path/URL of a YAML schema file ending in .yaml/.yml describing any other log
    (`pipeline.schema.load_schema_file` documents its keys)."""
    storage_options: dict | None = None
    """Extra fsspec storage options for the input URL (credentials come from the environment)."""
    wait_s: float = 0.0
    """How long ingest waits for a late input (and its `done_file`) before failing with "no input"; 0 fails at once."""
    poll_s: float = 60.0
    """While waiting, how often ingest looks again (and logs what it waits for)."""
    done_file: str = ""
    """A marker the exporter writes after the day's last file, e.g. `_SUCCESS`, in the folder of the
    day's files; when set, ingest starts only once it is there (empty: the files are enough)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS and not self.format.lower().endswith(SCHEMA_FILE_SUFFIXES):
            raise ValueError(
                f"input.format must be one of {FORMATS} or a schema file path ending in .yaml/.yml, got {self.format!r}"
            )
        if self.wait_s < 0:
            raise ValueError(f"input.wait_s must be >= 0 seconds, got {self.wait_s}")
        if self.poll_s <= 0:
            raise ValueError(f"input.poll_s must be > 0 seconds, got {self.poll_s}")
        if "/" in self.done_file or self.done_file in (".", ".."):
            raise ValueError(
                f"input.done_file must be a file name (it sits next to the day's files), got {self.done_file!r}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class IngestConfig:
    rows_per_partition: int = 200_000
    """Rows per Dask partition (and per output Parquet part): bounds one task's memory."""
    max_bad_fraction: float = 0.01
    """If more than this share of the rows read for a date (its files' lines) is quarantined, the date fails and
    nothing is committed."""
    block_size: int = 128 << 20
    """Plain (uncompressed) input files larger than this many bytes are cut into byte ranges of this
    size, each parsed by its own task; compressed files are always read by one task."""
    overlap_io: bool = True
    """Each task reads (and decompresses) its next chunk of lines in a reader thread and writes its
    previous chunk's Parquet in a writer thread while it parses the current chunk, so one compressed
    file is not read, parsed and written in turn; a task then holds up to 3 chunks instead of 1.
    Output is the same either way."""

    def __post_init__(self) -> None:
        if self.rows_per_partition < 1:
            raise ValueError(f"ingest.rows_per_partition must be >= 1, got {self.rows_per_partition}")
        if self.block_size < 1024:
            raise ValueError(f"ingest.block_size must be >= 1024 bytes, got {self.block_size}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"ingest.max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DaskConfig:
    address: str = ""
    """Scheduler address of an existing Dask cluster; empty starts a LocalCluster sized to the machine."""
    n_workers: int = 0
    """LocalCluster workers; 0 means one per core (capped at 4)."""
    threads_per_worker: int = 1
    """Threads per LocalCluster worker (each runs one task at a time per thread)."""
    processes: bool = True
    """LocalCluster with worker processes (True) or threads in this process (False)."""
    memory_limit: str = "4GiB"
    """Per-worker memory limit of the LocalCluster: a size such as 4GiB or 512MB, or `auto` (the
    machine's memory shared out among the workers).  Applies to worker processes only: threads
    would be measured by this whole process (`pipeline.cluster.local_memory_limit`)."""

    stall_timeout_s: float = 7200.0
    """A data stage fails (`pipeline.cluster.StageStalled`) when none of its Dask tasks finishes for this
    long, instead of waiting forever on a paused or lost worker; above the longest single task."""

    def __post_init__(self) -> None:
        if self.address and not _SCHEDULER_ADDRESS.match(self.address):
            raise ValueError(
                f"dask.address must be a scheduler address such as tcp://10.0.0.5:8786 (or empty to start a local "
                f"cluster), got {self.address!r}"
            )
        if self.memory_limit != "auto" and not _SIZE.match(self.memory_limit.strip()):
            raise ValueError(
                f"dask.memory_limit must be a size such as 4GiB or 512MB, or auto, got {self.memory_limit!r}"
            )
        if self.n_workers < 0:
            raise ValueError(f"dask.n_workers must be >= 0, got {self.n_workers}")
        if self.threads_per_worker < 1:
            raise ValueError(f"dask.threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if not self.stall_timeout_s > 0:
            raise ValueError(f"dask.stall_timeout_s must be > 0 seconds, got {self.stall_timeout_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class VocabConfig:
    window_days: int = 7
    """Counts are summed over this many days ending at the run date."""
    min_count: int = 2
    """A value is admitted (gets its own key) once its windowed count reaches this."""
    ttl_days: int = 30
    """A key unseen for this many days is evicted from the embedding store."""
    min_count_per_field: dict[str, int] = field(default_factory=dict)
    """Per-field override of `min_count`, by categorical column name (e.g. `{C3: 5}`)."""
    decay: float = 1.0
    """Per-day factor on counts in the window: a day k days before the run date weighs decay**k.
    1.0 (default) sums plain counts; admission compares the decayed sum (`score`) with min_count."""
    max_keys_per_field: int = 0
    """Cap on admitted keys per field, highest scores kept (ties: smaller key); 0 means no cap.
    Keys pushed out by the cap are evicted like TTL-expired ones."""
    merge_buckets: int = 0
    """The window merge runs as this many Dask tasks, each on one range of key hashes (every day's
    counts and the vocabulary are stored in these parts); 0 picks the smallest power of two that keeps
    a task's input (window day counts + previous vocabulary) under 2**20 rows. Results do not depend on it."""

    def __post_init__(self) -> None:
        for name in ("window_days", "min_count", "ttl_days"):
            if getattr(self, name) < 1:
                raise ValueError(f"vocab.{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.min_count_per_field, dict):
            raise ValueError(
                f"vocab.min_count_per_field must map field name -> count, got {self.min_count_per_field!r}"
            )
        for name, n in self.min_count_per_field.items():
            if not isinstance(name, str) or isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"vocab.min_count_per_field[{name!r}] must be an int >= 1, got {n!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"vocab.decay must be in (0, 1], got {self.decay}")
        if not 0 <= self.merge_buckets <= 65536:
            raise ValueError(
                f"vocab.merge_buckets must be in [0, 65536] (0 = from the data size), got {self.merge_buckets}"
            )
        if self.max_keys_per_field < 0:
            raise ValueError(f"vocab.max_keys_per_field must be >= 0 (0 = no cap), got {self.max_keys_per_field}")

    def min_count_of(self, field_name: str) -> int:
        """The admission threshold of categorical column `field_name`."""
        return self.min_count_per_field.get(field_name, self.min_count)


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodeConfig:
    eval_fraction: float = 0.1
    """The last share of the day, in time order, held out for evaluation."""
    raw_keys: bool = False
    """Write each field's key before the OOV rule (`r_<j>`, the value's own key) on every day: the input of
    `model.companion`.  26 more int64 columns on Criteo; off, they are written on small days only
    (`raw_keys_up_to`)."""
    raw_keys_up_to: int = 20_000
    """Also write them on every day of at most this many rows (0: only with `raw_keys`): the days whose models
    `model.companion: auto` may give a companion (fewer than 10,000 train rows), at a cost a small day does not
    notice.  Which days have them is the features manifest's `raw_keys`; a change re-encodes the days it moves."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"encode.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.raw_keys_up_to < 0:
            raise ValueError(
                f"encode.raw_keys_up_to must be >= 0 (0: only with encode.raw_keys), got {self.raw_keys_up_to}"
            )

    def raw_keys_for(self, rows: int) -> bool:
        """Whether a day of `rows` rows is encoded with the values' own keys."""
        return self.raw_keys or rows <= self.raw_keys_up_to
