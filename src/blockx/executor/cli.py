"""Command-line flags of ``python -m blockx.executor`` (the seed's, same defaults).

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

What the last three do: :mod:`.containment` (docs/security.md "Containment").

``BLOCKX_EXECUTOR_CODE_CACHE_MAX_ENTRIES`` is read by the module registry and
``BLOCKX_LOG_LEVEL`` / ``BLOCKX_LOG_FORMAT`` by :mod:`.logging_setup`; they are
environment variables, not flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ExecutorArgs", "build_parser", "parse_args"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorArgs:
    executor_id: str
    socket_path: str
    heartbeat_interval: float = 1.0
    executor_max_inflight: int = 128
    executor_max_runnable: int = 128
    connect_timeout: float = 10.0
    #: The black box file (blockx.wire.blackbox); None: none kept.
    blackbox_path: str | None = None
    #: The process's memory limit, MB; 0 = none.
    memory_limit_mb: int = 0
    #: RLIMIT_NOFILE set at start; 0 = leave as inherited.
    max_open_files: int = 0


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = unlimited), got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m blockx.executor",
        description="A BlockX Python executor: runs calls for one worker over a Unix socket.",
    )
    parser.add_argument("--executor-id", required=True, type=_non_empty, help="logical executor id")
    parser.add_argument(
        "--socket-path", required=True, type=_non_empty, help="the worker's Unix socket path"
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between heartbeats (default 1.0)",
    )
    parser.add_argument(
        "--executor-max-inflight",
        type=_non_negative_int,
        default=128,
        metavar="N",
        help="resident call contexts; 0 = unlimited (default 128)",
    )
    parser.add_argument(
        "--executor-max-runnable",
        type=_non_negative_int,
        default=128,
        metavar="N",
        help="stored only: the worker's dispatch threshold (default 128)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="how long to retry connecting to the socket (default 10)",
    )
    parser.add_argument(
        "--blackbox-path",
        type=_non_empty,
        default=None,
        metavar="PATH",
        help="a file the executor keeps naming the running call (read by the worker after a crash)",
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=_non_negative_int,
        default=0,
        metavar="MB",
        help="end the process (exit 87) when its memory passes MB; 0 = no limit (default)",
    )
    parser.add_argument(
        "--max-open-files",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="RLIMIT_NOFILE for the process; 0 = as inherited (default)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> ExecutorArgs:
    """Parse flags; on a bad flag argparse prints usage and exits with status 2."""
    ns = build_parser().parse_args(argv)
    return ExecutorArgs(
        executor_id=ns.executor_id,
        socket_path=ns.socket_path,
        heartbeat_interval=ns.heartbeat_interval,
        executor_max_inflight=ns.executor_max_inflight,
        executor_max_runnable=ns.executor_max_runnable,
        connect_timeout=ns.connect_timeout,
        blackbox_path=ns.blackbox_path,
        memory_limit_mb=ns.memory_limit_mb,
        max_open_files=ns.max_open_files,
    )
