"""``python -m meshbatch``: the ``meshbatch`` command line."""

import sys

from .cli import main

sys.exit(main())
