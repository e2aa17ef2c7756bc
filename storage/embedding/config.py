"""Typed configuration of the embedding store."""

from __future__ import annotations

from dataclasses import dataclass

from storage.embedding.rows.format import ROW_DTYPES, STATE_DTYPES, RowFormat
from storage.io.identity import result_field, run_field, shape_field

POLICIES = ("lfu", "lru")


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    embedding_dim: int = shape_field(16)
    """Width of every embedding row."""
    row_dtype: str = result_field("int8s", neutral="fp32")
    """Dtype of the stored embedding weights on every tier and in snapshots: `fp16`, `bf16`, `fp32`, `int8`
    (8-bit codes with an fp16 scale and offset per row, fbgemm's fused 8-bit row-wise layout: dim + 4 bytes), or
    `int8s` (8-bit codes symmetric around zero with one fp16 scale per row: dim + 2 bytes).
    Updates are computed in fp32 and written back with stochastic rounding, which keeps 8-bit rows within noise
    of fp32 ones (`docs/reports/2026-12-03-48-byte-rows.md`). Serving bundles keep their own `--dtype`."""
    state_dtype: str = result_field("log8", neutral="fp32")
    """Dtype of the sparse optimizer's stored state (Adam's m and v, AdaGrad's accumulator): `fp32`, or `log8`
    (one byte per value on a logarithmic grid, 9% resolution, written back with stochastic rounding:
    `storage.embedding.rows.quantize`)."""
    init_std: float = result_field(0.01)
    """Std of the deterministic per-key initialisation of a new row."""
    host_budget_mb: int = run_field(1024)
    """CPU memory for rows (weights + optimizer state + clock, and 64 B of bookkeeping each); over it, the
    coldest rows go to SSD."""
    device_cache_rows: str | int = run_field("auto")
    """Rows cached on the training device (GPU HBM, or CPU); 0 disables the device cache. `auto`: the host budget's
    rows on CUDA, within a quarter of free GPU memory; 0 elsewhere (`storage.embedding.tiered.device_cache_rows`)."""
    cache_policy: str = run_field("lfu")
    """Device-cache replacement: `lfu` (HET's choice) or `lru`."""
    local_dir: str = run_field("")
    """Node-local directory of the SSD tier; must be a local path. Empty: `<root>/_local` for a
    local root, else a folder under the user's cache directory."""

    def __post_init__(self) -> None:
        if self.embedding_dim < 1:
            raise ValueError(f"store.embedding_dim must be >= 1, got {self.embedding_dim}")
        if self.row_dtype not in ROW_DTYPES:
            raise ValueError(f"store.row_dtype must be one of {sorted(ROW_DTYPES)}, got {self.row_dtype!r}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"store.state_dtype must be one of {sorted(STATE_DTYPES)}, got {self.state_dtype!r}")
        if self.init_std <= 0:
            raise ValueError(f"store.init_std must be > 0, got {self.init_std}")
        if self.host_budget_mb < 1:
            raise ValueError(f"store.host_budget_mb must be >= 1, got {self.host_budget_mb}")
        rows = self.device_cache_rows
        if isinstance(rows, str) and rows.isdigit():  # a number the YAML/CLI loader handed over as text
            rows = int(rows)
            object.__setattr__(self, "device_cache_rows", rows)
        if rows != "auto" and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise ValueError(f"store.device_cache_rows must be 'auto' or an integer >= 0, got {rows!r}")
        if self.cache_policy not in POLICIES:
            raise ValueError(f"store.cache_policy must be one of {POLICIES}, got {self.cache_policy!r}")
        if "://" in self.local_dir and not self.local_dir.startswith("file://"):
            raise ValueError(
                f"store.local_dir must be a local directory (the SSD tier uses direct I/O), got {self.local_dir!r}"
            )

    def row_format(self, optimizer: str, seed: int = 0) -> RowFormat:
        """The rows this store keeps when trained with `optimizer` (`optim.sparse_optimizer`), their stochastic
        rounding seeded with `seed` (`optim.seed`)."""
        return RowFormat(self.embedding_dim, optimizer, self.row_dtype, self.state_dtype, seed=seed)
