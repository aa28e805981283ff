"""The exit statuses of the ``blockx`` command, in one place.

:mod:`blockx.cli` prints them in its help (:data:`EXIT_STATUS_HELP` is made
from the constants, so the help cannot drift from what the command returns);
:mod:`blockx.cli.report` and :mod:`blockx.cli.run` return them. Nothing here
imports more than the standard library: ``blockx --help`` stays fast.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGPIPE",
    "EXIT_STATUS_HELP",
    "EXIT_USAGE",
    "INTERRUPTED_STATUS",
]

#: Every call succeeded.
EXIT_OK: Final = 0
#: The task failed, or at least one call failed (each failed call is reported).
EXIT_FAILED: Final = 1
#: Bad usage, task file, calls file or configuration: nothing was run.
EXIT_USAGE: Final = 2
#: The output pipe was closed (``| head``): 128 + SIGPIPE.
EXIT_SIGPIPE: Final = 141

#: The exit status of a run interrupted by a signal: 128 + its number.
INTERRUPTED_STATUS: Final = {"SIGINT": 130, "SIGTERM": 143}

EXIT_STATUS_HELP: Final = f"""\
exit status:
  {EXIT_OK:<4} every call succeeded
  {EXIT_FAILED:<4} the task failed, or at least one call failed (each failed call is reported),
       or the calls file changed while it was read
  {EXIT_USAGE:<4} bad usage, task file, calls file or configuration (nothing was run)
  {INTERRUPTED_STATUS["SIGINT"]:<4} interrupted (Ctrl-C); {INTERRUPTED_STATUS["SIGTERM"]} \
terminated (SIGTERM): the task was cancelled
  {EXIT_SIGPIPE:<4} the output pipe was closed (e.g. `| head`); one line on stderr says so
"""
