"""Recommendation models as TorchRec's ``torchrec.models`` names them: :mod:`shardwise.models.dlrm`
(``DLRM``, ``DLRM_DCN``, ``DLRM_Projection``, ``DLRMTrain`` and their parts).

Example:
    >>> from shardwise.models.dlrm import DLRM, DLRMTrain, choose
    >>> choose(4, 2)
    6
"""

from . import dlrm
from .dlrm import (
    DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain, DenseArch, InteractionArch, InteractionDCNArch,
    InteractionProjectionArch, OverArch, SparseArch, choose,
)

__all__ = ["dlrm", "DLRM", "DLRM_DCN", "DLRM_Projection", "DLRMTrain", "SparseArch", "DenseArch", "InteractionArch",
           "InteractionDCNArch", "InteractionProjectionArch", "OverArch", "choose"]
