# The session-wide pool fixture. Once tests/conftest.py registers
# `pytest_plugins = ["shardwise.testing.pytest_plugin"]` for the whole suite, delete this import:
# two definitions of a session fixture would start two sets of processes.
from shardwise.testing.pytest_plugin import dist_pools  # noqa: F401
