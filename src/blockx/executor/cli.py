"""Command-line flags of ``python -m blockx.executor`` (the seed's, same defaults).

The flags, their defaults and their checks are defined once, in
:mod:`blockx.wire.launch` (the worker writes the same command line from the
same definition); this module is the executor's name for them. A bad flag
prints the usage and exits with status 2.

What ``--blackbox-path``, ``--memory-limit-mb`` and ``--max-open-files`` do:
:mod:`.containment` (docs/security.md "Containment of one executor process").

``BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES`` is read by the module registry and
``BLOCKX_LOG_LEVEL`` / ``BLOCKX_LOG_FORMAT`` by :mod:`.logging_setup`; they are
environment variables, not flags.
"""

from __future__ import annotations

from collections.abc import Sequence

from blockx.wire.launch import ExecutorArgs, build_parser

__all__ = ["ExecutorArgs", "build_parser", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> ExecutorArgs:
    """Parse flags; on a bad flag argparse prints usage and exits with status 2."""
    return ExecutorArgs.parse(argv)
