"""Serving the published model: bundles, export from the registry, the online scorer (`ctrpipe score-server`).

bundle.py   the bundle format (manifest with checksums; committed atomically) and its reader
export.py   registry version -> full / delta bundle; what the publish stage writes; `models show` sizes
tables.py   a bundle's rows as a lookup (in memory, or memory-mapped via KeyIndex); delta chains
model.py    one loaded bundle: raw lines -> probabilities (a batch of requests at once), its smoke check
lines.py    request entries (positional lines read by field count, named columns) -> whole lines of the format
small.py    plain lines of small batches (any schema) straight to arrays, as the feature path encodes them
batcher.py  micro-batching of concurrent requests
reload.py   where bundles come from; polling LATEST and switching versions atomically
metrics.py  `/metrics` in the Prometheus text format
app.py      the HTTP API (Starlette); server.py binds the port and runs it on uvicorn
"""
