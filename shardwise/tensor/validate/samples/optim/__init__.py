"""Validator samples for ``ops/optim/``, one file per family there (imports nothing: ``samples/__init__`` imports
them in order)."""
