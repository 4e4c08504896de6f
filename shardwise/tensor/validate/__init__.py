"""The sharding-rule validator: every registered rule checked against the op on full tensors, on
simulated ranks in one process (``shardwise validate`` on the command line).

| file | holds |
| --- | --- |
| ``checker.py`` | ``validate_rules``: the cases (op x sample x mesh x strategy), planned as the dispatcher plans |
| ``per_rank.py`` | local inputs from full tensors, the local call, assembling and comparing the result |
| ``thread_ranks.py`` | ranks as threads with simulated collectives, for kernels that communicate |
| ``report.py`` | ``ValidationReport`` / ``OpReport`` / ``Failure`` and their printed table |
| ``command.py`` | the ``shardwise validate`` command line |
| ``samples/`` | sample inputs, one file per op family of ``shardwise/tensor/ops`` |

>>> from torch.ops import aten
>>> validate_rules([aten.mm.default], world_sizes=(2, (2, 2))).ok
True
"""

from .checker import NeedsRealRanks, validate_rules
from .command import main
from .report import Failure, OpReport, ValidationReport
from .samples import Plain, Sample

__all__ = ["validate_rules", "ValidationReport", "OpReport", "Failure", "NeedsRealRanks", "Sample", "Plain", "main"]
