"""How one call reaches the dispatcher, and what it may skip: the ``__torch_function__`` fast path
(``fastpath.py``), the propagation cache's keys (``plan_cache.py``), per-context function hooks such as
``loss_parallel`` (``function_hooks.py``), buffer donation for pending reductions (``donation.py``) and the
constructor of each op's result (``wrapping.py``)."""
