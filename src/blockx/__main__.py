"""``python -m blockx``: the ``blockx`` command (see :mod:`blockx.cli`)."""

import sys

from blockx.cli import main

sys.exit(main())
