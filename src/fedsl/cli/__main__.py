"""``python -m fedsl.cli``: the ``fedsl`` command."""

import sys

from fedsl.cli import main

sys.exit(main())
