"""Live resharding: pieces (the overlap of old and new boxes), the one move executor, measured load
and rebalancing proposals made from it."""

from .api import ReshardStats, changes_digest, current_plan, reshard
from .load import LoadStats, LookupCounter, TableLoad, load_stats
from .pieces import Piece, plan_pieces
from .rebalance import propose_rebalance

__all__ = ["reshard", "ReshardStats", "current_plan", "changes_digest", "Piece", "plan_pieces", "LookupCounter",
           "TableLoad", "LoadStats", "load_stats", "propose_rebalance"]
