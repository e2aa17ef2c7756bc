"""Raw logs -> `events/date=D` and `quarantine/date=D`: reading, parsing, the Dask stage, bad-row reports."""
