"""Architectures beside the default attention model, and their building blocks (see `reference`)."""
