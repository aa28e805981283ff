"""The executor's flags: the seed's names and defaults, and what is refused."""

from __future__ import annotations

import pytest

from blockx.executor.cli import ExecutorArgs, parse_args


def test_defaults_are_the_seeds() -> None:
    args = parse_args(["--executor-id", "exec-1", "--socket-path", "/tmp/w.sock"])
    assert args == ExecutorArgs(
        executor_id="exec-1",
        socket_path="/tmp/w.sock",
        heartbeat_interval=1.0,
        executor_max_inflight=128,
        executor_max_runnable=128,
        connect_timeout=10.0,
    )


def test_every_flag_is_read() -> None:
    args = parse_args(
        [
            "--executor-id=e9",
            "--socket-path=/run/x.sock",
            "--heartbeat-interval=0.25",
            "--executor-max-inflight=0",
            "--executor-max-runnable=7",
            "--connect-timeout=3",
        ]
    )
    assert (args.executor_id, args.socket_path) == ("e9", "/run/x.sock")
    assert args.heartbeat_interval == 0.25
    assert args.executor_max_inflight == 0  # unlimited
    assert args.executor_max_runnable == 7
    assert args.connect_timeout == 3.0


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--executor-id", "e"],
        ["--socket-path", "/tmp/s"],
        ["--executor-id", "", "--socket-path", "/tmp/s"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--executor-max-inflight", "-1"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--executor-max-inflight", "many"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--executor-max-runnable", "-5"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--heartbeat-interval", "0"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--heartbeat-interval", "-1"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--heartbeat-interval", "inf"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--heartbeat-interval", "soon"],
        ["--executor-id", "e", "--socket-path", "/tmp/s", "--unknown-flag"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_the_executor_imports_nothing_from_the_worker() -> None:
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import blockx.executor.__main__, blockx.executor.runtime, blockx.executor.uds_session\n"
        "import blockx.executor.heartbeat, blockx.executor.process_metrics\n"
        "bad = sorted(m for m in sys.modules if m.startswith('blockx.worker') or m in ('asyncio', 'uvloop'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""
