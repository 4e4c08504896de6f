"""Neural-net layer ops: softmax/nll_loss/layer_norm (``functional``), elementwise ``losses``,
convolution/pooling/batch norm (``spatial``), scaled dot-product ``attention``, ``embedding`` lookups.

Imports nothing: ``shardwise.tensor.ops`` imports the families in the order their registrations need."""
