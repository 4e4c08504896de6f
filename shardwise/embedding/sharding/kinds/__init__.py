"""One module per sharding type (``base.py``: what they share); each supplies a layout and a factory of
its three stages (``..stages``). The registry of them is ``shardwise.embedding.sharding.SHARDERS``.

Example:
    >>> from shardwise.embedding.sharding.kinds import table_wise
    >>> table_wise.SHARDER.replicated
    False
"""
