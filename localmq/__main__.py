"""``python -m localmq``: the ``localmq`` command."""

import sys

from localmq.cli import main

sys.exit(main())
