"""What an executor imports before its first call (issue #18: every run starts executors,
so their start-up is paid on every run, once per executor)."""

from __future__ import annotations

import subprocess
import sys

from blockx.wire.launch import ExecutorArgs

#: What ``blockx.executor.__main__`` imports on a real start, then its command line read.
_START = """
import sys
import blockx.executor.__main__
import blockx.executor.containment, blockx.executor.process_metrics, blockx.executor.uds_session
import blockx.executor.runtime, blockx.executor.heartbeat
from blockx.executor.cli import parse_args
from blockx.executor.process_metrics import ProcessMetricsSampler
parse_args({argv!r})
ProcessMetricsSampler().probe_capabilities(attempts=1)  # as the executor's start does
print(" ".join(sorted(name for name in {unused!r} if name in sys.modules)) or "-")
"""

#: Modules a start has no use for: argparse (and what its help formatter and message
#: catalogue import) reads only a command line the worker does not write; hashlib hashes
#: only a fetched function's source, at its first call. psutil is read only where
#: /proc/self/statm is missing (~20 ms to import); typing_extensions (with inspect, dis
#: and ast: ~12 ms) is what msgspec takes when installed, and Python 3.11's typing does.
UNUSED_AT_START = (
    "argparse",
    "gettext",
    "hashlib",
    "locale",
    "shutil",
    "psutil",
    "typing_extensions",
)


def test_an_executor_start_imports_nothing_it_does_not_use() -> None:
    argv = ExecutorArgs(executor_id="exec-0", socket_path="/tmp/w.sock").to_argv()
    code = _START.format(argv=argv, unused=UNUSED_AT_START)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["-"], done.stdout
