"""``python -m phronomy``: see :mod:`phronomy.cli`."""

import sys

from phronomy.cli import main

sys.exit(main())
