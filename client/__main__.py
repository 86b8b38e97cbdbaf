"""``python -m client``: the same as the ``client`` console script."""

import sys

from client.cli import main

sys.exit(main())
