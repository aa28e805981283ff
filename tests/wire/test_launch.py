"""The executor's command line, written by the worker and read by the executor
(blockx.wire.launch): what one side writes, the other reads back unchanged."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.executor.cli import parse_args
from blockx.wire.launch import ExecutorArgs, build_parser
from blockx.worker.pool.launch import ExecutorLaunchSpec, executor_command

#: A value other than the default for every flag.
EVERY_FLAG_SET = ExecutorArgs(
    executor_id="exec-7",
    socket_path="/run/blockx w/worker.sock",
    heartbeat_interval=0.1,
    executor_max_inflight=0,
    executor_max_runnable=3,
    connect_timeout=2.5,
    blackbox_path="/run/blockx w/exec-7.blackbox",
    memory_limit_mb=512,
    max_open_files=64,
)


def executor_side(spec: ExecutorLaunchSpec) -> ExecutorArgs:
    """What ``python -m blockx.executor`` reads from the worker's command."""
    command = executor_command(spec)
    assert command[:3] == [spec.python, "-m", "blockx.executor"]
    return parse_args(command[3:])


def test_every_flag_of_the_parser_is_a_field_set_above() -> None:
    options = {
        action.dest
        for action in build_parser()._actions
        if not isinstance(action, argparse._HelpAction)
    }
    fields = {f.name for f in dataclasses.fields(ExecutorArgs)}
    assert options == fields
    for item in dataclasses.fields(ExecutorArgs):
        assert getattr(EVERY_FLAG_SET, item.name) != item.default, item.name


def test_every_flag_set_round_trips() -> None:
    spec = ExecutorLaunchSpec(args=EVERY_FLAG_SET, run_mark="w:exec-7:1")
    assert executor_side(spec) == EVERY_FLAG_SET
    argv = EVERY_FLAG_SET.to_argv()
    for item in dataclasses.fields(ExecutorArgs):
        assert "--" + item.name.replace("_", "-") in argv, item.name


def test_defaults_round_trip_and_write_only_the_seeds_flags() -> None:
    args = ExecutorArgs(executor_id="exec-0", socket_path="/tmp/w.sock")
    assert executor_side(ExecutorLaunchSpec(args=args)) == args
    assert args.to_argv() == [
        "--executor-id", "exec-0",
        "--socket-path", "/tmp/w.sock",
        "--heartbeat-interval", "1.0",
        "--executor-max-inflight", "128",
        "--executor-max-runnable", "128",
    ]  # fmt: skip


_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(lambda s: s.strip() != "" and not s.startswith("-"))  # as the worker names them
_seconds = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
_count = st.integers(min_value=0, max_value=2**31)


@given(
    executor_id=_text,
    socket_path=_text,
    heartbeat_interval=_seconds,
    executor_max_inflight=_count,
    executor_max_runnable=_count,
    connect_timeout=_seconds,
    blackbox_path=st.none() | _text,
    memory_limit_mb=_count,
    max_open_files=_count,
)
def test_any_valid_command_line_round_trips(**values: object) -> None:
    args = ExecutorArgs(**values)  # type: ignore[arg-type]
    assert ExecutorArgs.parse(args.to_argv()) == args
    assert executor_side(ExecutorLaunchSpec(args=args)) == args


def test_the_real_executor_refuses_a_bad_flag_with_status_2() -> None:
    argv = [*executor_command(ExecutorLaunchSpec(args=EVERY_FLAG_SET)), "--no-such-flag"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "usage: python -m blockx.executor" in done.stderr


@pytest.mark.parametrize("value", [0.1, 1.0, 1 / 3, 12345.678901234567])
def test_seconds_are_written_so_they_read_back_exactly(value: float) -> None:
    args = dataclasses.replace(EVERY_FLAG_SET, heartbeat_interval=value, connect_timeout=value)
    assert ExecutorArgs.parse(args.to_argv()) == args


def argparse_side(argv: list[str]) -> ExecutorArgs:
    """What argparse alone reads from ``argv`` (the parser ``ExecutorArgs.parse`` falls back on)."""
    namespace = build_parser().parse_args(argv)
    return ExecutorArgs(
        **{f.name: getattr(namespace, f.name) for f in dataclasses.fields(ExecutorArgs)}
    )


@pytest.mark.parametrize(
    "argv",
    [
        EVERY_FLAG_SET.to_argv(),
        ["--executor-id", "e", "--socket-path", "/s", "--connect-timeout", "3"],
        ["--socket-path", "/s", "--executor-id", "e"],  # another order
        ["--executor-id=e", "--socket-path=/s"],  # --flag=value
        ["--executor-id", "e", "--socket", "/s", "--heartbeat", "2"],  # abbreviations
        ["--executor-id", "a", "--executor-id", "b", "--socket-path", "/s"],  # last one wins
        ["--executor-id", "e", "--socket-path", "/s", "--memory-limit-mb", "007"],
    ],
)
def test_any_spelling_reads_as_argparse_reads_it(argv: list[str]) -> None:
    assert ExecutorArgs.parse(argv) == argparse_side(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--executor-id", "e"],  # --socket-path missing
        ["--executor-id", "e", "--socket-path", "/s", "--heartbeat-interval", "-1"],
        ["--executor-id", "e", "--socket-path", "/s", "--heartbeat-interval", "0"],
        ["--executor-id", " ", "--socket-path", "/s"],
        ["--executor-id", "e", "--socket-path", "/s", "--max-open-files", "x"],
        ["--executor-id", "e", "--socket-path", "/s", "--no-such-flag", "1"],
        ["--executor-id", "e", "--socket-path"],
    ],
)
def test_a_bad_command_line_is_refused_as_argparse_refuses_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ours:
        ExecutorArgs.parse(argv)
    ours_err = capsys.readouterr().err
    with pytest.raises(SystemExit) as theirs:
        argparse_side(argv)
    assert ours.value.code == theirs.value.code == 2
    assert ours_err == capsys.readouterr().err
    assert "usage: python -m blockx.executor" in ours_err


def test_the_written_command_line_is_read_without_argparse() -> None:
    # argparse's parser, formatters and message catalogue are ~5 ms of every executor's start.
    code = (
        "import sys\n"
        "from blockx.executor.cli import parse_args\n"
        f"args = parse_args({EVERY_FLAG_SET.to_argv()!r})\n"
        "print(repr(args.executor_id), 'argparse' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["'exec-7'", "False"]
