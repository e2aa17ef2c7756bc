"""Benchmarks: each `python -m bench.<name>` prints a table and writes JSON to bench/results/."""
