"""Changing a job's plan: resuming on another world size (`replan.py`) and the live reshard's decision
from measured load (`reshard.py`)."""
