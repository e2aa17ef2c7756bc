"""The SSD tier: `store.SsdStore` (the store contract over one shard), `shard_file` (its rows in the row file:
appends, reclaimed units, compaction), `disk_format` (records, meta.json, index files), `unit_log` (where appends
go), `direct_io` (aligned unit I/O), `compact_index` (the in-memory key -> slot index) and `upgrade` (a shard of
another record or row format converted where it lies)."""
