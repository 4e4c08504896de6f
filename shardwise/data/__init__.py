"""Real click logs: Criteo-format files read with pyarrow, and prepared binary columns."""
