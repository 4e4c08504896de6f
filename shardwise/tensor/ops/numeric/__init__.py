"""Ops on tensor values: ``pointwise`` (elementwise, with broadcasting), ``reduction`` (reductions,
scans, orderings), ``matmul`` (products), ``norm`` (vector norms, gradient clipping), ``random``.

Imports nothing: ``shardwise.tensor.ops`` imports the families in the order their registrations need."""
