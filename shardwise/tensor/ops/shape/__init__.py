"""Ops that move, select or reinterpret elements: ``view`` (views, reshapes, slicing, cat/stack),
``structure`` (tril, flip, roll, repeat, padding, ...), ``indexing`` (gather, scatter, index_*),
``complex`` (view_as_complex/real, lazy conj/neg views).

Imports nothing: ``shardwise.tensor.ops`` imports the families in the order their registrations need."""
