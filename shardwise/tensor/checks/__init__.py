"""Cross-rank checks before data moves: every rank asked the same (``agreement``: checked mode's
digest of each redistribute call; ``layout``: ``distribute_tensor`` / ``from_local(run_check=True)``
layouts), so a mismatch raises the same error everywhere instead of running mismatched collectives."""
