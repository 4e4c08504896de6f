"""Optimizer-step ops: ``foreach`` (the multi-tensor ops torch.optim runs) and ``fused_optim`` (fused
Adam/AdamW/SGD/Adagrad steps).

Imports nothing: ``shardwise.tensor.ops`` imports the families in the order their registrations need."""
