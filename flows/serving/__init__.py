"""Serving the published model: bundles, export from the registry, the online scorer (`ctrpipe score-server`).

    bundle.py   the bundle format (manifest with checksums; committed atomically) and its reader
    export.py   registry version -> full / delta bundle; what the publish stage writes; `models show` sizes
    tables.py   a bundle's rows as a lookup (in memory, or memory-mapped via KeyIndex); delta chains
    model.py    one loaded bundle: raw lines -> probabilities, and its smoke check
    batcher.py  micro-batching of concurrent requests
    reload.py   where bundles come from; polling LATEST and switching versions atomically
    app.py      the HTTP API (Starlette); server.py runs it on uvicorn
"""
