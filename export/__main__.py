import sys

from export.exporter import main

sys.exit(main())
