"""Distributed CTR trainer: model, k-step Adam, two-phase communication, launcher, evaluation."""
