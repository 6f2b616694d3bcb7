"""``python -m entropy_law`` = the ``entropy-law`` command."""

import sys

from entropy_law.cli import main

sys.exit(main())
