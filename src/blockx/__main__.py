"""``python -m blockx``: the ``blockx`` command (see :mod:`blockx.cli`)."""

from blockx.cli import console_main

console_main()
