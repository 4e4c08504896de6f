"""``python -m shardwise.tensor.validate`` runs ``shardwise validate``."""

import sys

from .command import main

if __name__ == "__main__":   # importing the module (doctest, pydoc, a module walk) runs nothing
    sys.exit(main())
