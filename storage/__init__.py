"""Tiered embedding store (device cache / host memory / SSD) and the model registry."""
