"""The executor's command line: one definition for the worker that writes it and the
executor that reads it (docs/protocol.md "The executor's command line").

Theory of operation
-------------------
:class:`ExecutorArgs` is the whole command line of ``python -m blockx.executor``:
one field per flag, its default the flag's default, and in the field's metadata
(:func:`_flag`) how the flag's text is checked and what ``--help`` says. Both
directions are derived from those fields, so a flag is added in one place:

* the worker (``blockx.worker.pool.launch``) builds an :class:`ExecutorArgs` and
  writes it with :meth:`ExecutorArgs.to_argv`;
* the executor (``blockx.executor.cli``) reads it with :meth:`ExecutorArgs.parse`
  (argparse: a bad flag prints the usage and exits with status 2).

``parse(args.to_argv()) == args`` for every valid ``args`` (a test holds both
sides to it). ``to_argv`` writes the flags in the order of the fields (the
order of ``--help``): always the first five (the seed's), the others only when
they differ from their default, so the command line stays the seed's unless a
feature is on.

=========================== ======= ==============================================
flag                        default meaning
=========================== ======= ==============================================
``--executor-id``           —       logical executor id (reused across restarts)
``--socket-path``           —       the worker's Unix socket
``--heartbeat-interval``    1.0     seconds between heartbeats
``--executor-max-inflight`` 128     resident contexts; 0 = unlimited
``--executor-max-runnable`` 128     stored only (the worker's dispatch threshold)
``--connect-timeout``       10      seconds to retry connecting to the socket
``--blackbox-path``         —       the black box file (``blockx.wire.blackbox``)
``--memory-limit-mb``       0       exit 87 past this memory (0 = none)
``--max-open-files``        0       RLIMIT_NOFILE soft and hard (0 = inherited)
=========================== ======= ==============================================

What the last three do: ``blockx.executor.containment`` (docs/security.md
"Containment of one executor process").

IO-free like the rest of :mod:`blockx.wire`, apart from argparse's usage message
on a bad flag. Not on any hot path: parsed once per executor, written once per spawn.
It is on every executor's start, though: a command line as ``to_argv`` writes it is
read without argparse (``_read_as_written``; argparse is imported only for anything
else: ``--help``, another spelling, a bad flag).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import argparse

__all__ = ["PROG", "ExecutorArgs", "build_parser"]

#: The program name in the executor's usage message.
PROG: Final = "python -m blockx.executor"
_DESCRIPTION: Final = "A BlockX Python executor: runs calls for one worker over a Unix socket."
_FLAG: Final = "blockx.flag"


def _bad_value(message: str) -> Exception:
    """What a reader raises: the error argparse reports with the flag's name (imported
    here: a good command line is read without argparse, see :func:`_read_as_written`)."""
    import argparse

    return argparse.ArgumentTypeError(message)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad_value(f"not an integer: {text!r}") from None
    if value < 0:
        raise _bad_value(f"must be >= 0 (0 = unlimited), got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad_value(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise _bad_value(f"must be a positive number of seconds, got {text}")
    return value


def _non_empty(text: str) -> str:
    if not text.strip():
        raise _bad_value("must not be empty")
    return text


@dataclass(frozen=True, slots=True)
class _Flag:
    """How one field of :class:`ExecutorArgs` is written and read on the command line."""

    #: Checks and converts the flag's text (raises ``argparse.ArgumentTypeError``, made
    #: by :func:`_bad_value`).
    read: Callable[[str], Any]
    help: str
    metavar: str | None = None
    #: Written even at its default (the seed's flags); others only when set.
    always: bool = False

    def write(self, value: object) -> str:
        # repr: the shortest text that reads back as the same float (str(0.1) would too
        # since 3.1, but repr says so).
        return repr(value) if isinstance(value, float) else str(value)


def _flag(
    read: Callable[[str], Any], help: str, *, metavar: str | None = None, always: bool = False
) -> Mapping[str, _Flag]:
    return {_FLAG: _Flag(read=read, help=help, metavar=metavar, always=always)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorArgs:
    """The executor's command line; the flag of a field is ``--`` + its name with dashes."""

    executor_id: str = field(metadata=_flag(_non_empty, "logical executor id", always=True))
    socket_path: str = field(
        metadata=_flag(_non_empty, "the worker's Unix socket path", always=True)
    )
    heartbeat_interval: float = field(
        default=1.0,
        metadata=_flag(
            _positive_float,
            "seconds between heartbeats (default 1.0)",
            metavar="SECONDS",
            always=True,
        ),
    )
    executor_max_inflight: int = field(
        default=128,
        metadata=_flag(
            _non_negative_int,
            "resident call contexts; 0 = unlimited (default 128)",
            metavar="N",
            always=True,
        ),
    )
    executor_max_runnable: int = field(
        default=128,
        metadata=_flag(
            _non_negative_int,
            "stored only: the worker's dispatch threshold (default 128)",
            metavar="N",
            always=True,
        ),
    )
    connect_timeout: float = field(
        default=10.0,
        metadata=_flag(
            _positive_float,
            "how long to retry connecting to the socket (default 10)",
            metavar="SECONDS",
        ),
    )
    #: The black box file (blockx.wire.blackbox); None: none kept.
    blackbox_path: str | None = field(
        default=None,
        metadata=_flag(
            _non_empty,
            "a file the executor keeps naming the running call (read by the worker after a crash)",
            metavar="PATH",
        ),
    )
    #: The process's memory limit, MB; 0 = none.
    memory_limit_mb: int = field(
        default=0,
        metadata=_flag(
            _non_negative_int,
            "end the process (exit 87) when its memory passes MB; 0 = no limit (default)",
            metavar="MB",
        ),
    )
    #: RLIMIT_NOFILE set at start; 0 = leave as inherited.
    max_open_files: int = field(
        default=0,
        metadata=_flag(
            _non_negative_int,
            "RLIMIT_NOFILE for the process; 0 = as inherited (default)",
            metavar="N",
        ),
    )

    def to_argv(self) -> list[str]:
        """The flags that make :meth:`parse` return ``self`` (the seed's flags first)."""
        argv: list[str] = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            flag: _Flag = item.metadata[_FLAG]
            if value is None or (not flag.always and value == item.default):
                continue
            argv += [_option(item.name), flag.write(value)]
        return argv

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None) -> ExecutorArgs:
        """Read flags (``sys.argv[1:]`` when None); a bad flag: usage on stderr, exit 2.

        A command line as :meth:`to_argv` writes it is read directly
        (:func:`_read_as_written`); anything else goes through argparse, which reads
        it or reports what is wrong."""
        if argv is None:
            argv = sys.argv[1:]
        written = _read_as_written(argv)
        if written is not None:
            return written
        namespace = build_parser().parse_args(argv)
        return cls(**{item.name: getattr(namespace, item.name) for item in dataclasses.fields(cls)})


def _read_as_written(argv: Sequence[str]) -> ExecutorArgs | None:
    """``argv`` read without argparse when it is ``--flag value`` pairs of this class's
    flags, each at most once, every required one there, no value starting with ``-``
    and every value good -- what :meth:`ExecutorArgs.to_argv` writes, so what every
    executor the worker starts is given; then argparse would read the same (its parser,
    help formatters and message catalogue are ~5 ms of an executor's start). None for
    anything else (``--help``, ``--flag=value``, an abbreviation, a repeated flag, a
    bad value...): argparse then reads it, or reports it as it always did."""
    if len(argv) % 2:
        return None
    by_option = {_option(item.name): item for item in dataclasses.fields(ExecutorArgs)}
    values: dict[str, Any] = {}
    for at in range(0, len(argv), 2):
        item = by_option.get(argv[at])
        text = argv[at + 1]
        if item is None or item.name in values or text.startswith("-"):
            return None
        flag: _Flag = item.metadata[_FLAG]
        try:
            values[item.name] = flag.read(text)
        except Exception:  # argparse says what is wrong with it
            return None
    for item in by_option.values():
        if item.name not in values and item.default is dataclasses.MISSING:
            return None
    return ExecutorArgs(**values)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The executor's argparse parser, one option per field of :class:`ExecutorArgs`."""
    import argparse

    parser = argparse.ArgumentParser(prog=PROG, description=_DESCRIPTION)
    for item in dataclasses.fields(ExecutorArgs):
        flag: _Flag = item.metadata[_FLAG]
        required = item.default is dataclasses.MISSING
        options: dict[str, Any] = {"type": flag.read, "help": flag.help, "required": required}
        if not required:
            options["default"] = item.default
        if flag.metavar is not None:
            options["metavar"] = flag.metavar
        parser.add_argument(_option(item.name), **options)
    return parser
