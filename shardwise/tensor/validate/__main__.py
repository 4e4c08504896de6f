"""``python -m shardwise.tensor.validate`` runs ``shardwise validate``."""

import sys

from .command import main

sys.exit(main())
