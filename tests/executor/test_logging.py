"""logging_setup: JSON lines with the executor and call fields, the text format, levels
from BLOCKX_LOG_LEVEL, and the running call's fields filled in by a provider."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from blockx.executor.logging_setup import (
    configure_logging,
    parse_log_level,
    set_call_fields_provider,
)


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    set_call_fields_provider(None)
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


def _configure(**env: str) -> io.StringIO:
    stream = io.StringIO()
    configure_logging("exec-7", environ=env, stream=stream)
    return stream


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_is_the_default_with_ts_level_logger_msg_and_executor_id() -> None:
    stream = _configure()
    logging.getLogger("blockx.executor.test").info("hello %s", "world")
    (line,) = _lines(stream)
    assert line["msg"] == "hello world"
    assert line["level"] == "info"
    assert line["logger"] == "blockx.executor.test"
    assert line["executorId"] == "exec-7"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(line["ts"]))


def test_call_fields_from_extra_are_top_level_keys() -> None:
    stream = _configure()
    logging.getLogger("blockx.executor.test").warning(
        "call failed",
        extra={
            "callId": "t1/c42",
            "taskId": "t1",
            "attemptSeq": 2,
            "functionId": "adder",
            "errorKind": "user_error",
        },
    )
    (line,) = _lines(stream)
    assert line["callId"] == "t1/c42"
    assert line["taskId"] == "t1"
    assert line["attemptSeq"] == 2
    assert line["functionId"] == "adder"
    assert line["errorKind"] == "user_error"
    assert line["level"] == "warning"


def test_absent_call_fields_are_left_out() -> None:
    stream = _configure()
    logging.getLogger("x").info("plain")
    (line,) = _lines(stream)
    assert not {"callId", "taskId", "attemptSeq", "functionId"} & set(line)


def test_the_provider_fills_in_the_running_call() -> None:
    stream = _configure()
    current: dict[str, object] | None = {
        "callId": "c9",
        "taskId": "t9",
        "attemptSeq": 1,
        "functionId": None,
    }
    set_call_fields_provider(lambda: current)
    log = logging.getLogger("blockx.executor.runtime")
    log.info("inside")
    log.info("explicit", extra={"callId": "other"})
    current = None
    log.info("outside")
    inside, explicit, outside = _lines(stream)
    assert (inside["callId"], inside["taskId"], inside["attemptSeq"]) == ("c9", "t9", 1)
    assert "functionId" not in inside
    assert explicit["callId"] == "other" and "taskId" not in explicit
    assert "callId" not in outside


def test_a_failing_provider_never_breaks_logging() -> None:
    stream = _configure()

    def broken() -> dict[str, object]:
        raise RuntimeError("boom")

    set_call_fields_provider(broken)
    logging.getLogger("x").info("still logged")
    assert _lines(stream)[0]["msg"] == "still logged"


def test_exceptions_are_formatted_into_exc() -> None:
    stream = _configure()
    try:
        raise ValueError("bad value")
    except ValueError:
        logging.getLogger("x").exception("failed")
    (line,) = _lines(stream)
    assert "ValueError: bad value" in str(line["exc"])
    assert line["level"] == "error"


def test_values_json_cannot_hold_are_written_with_repr() -> None:
    stream = _configure()
    logging.getLogger("x").info("odd", extra={"obj": object(), "big": 1 << 100, "path": b"\x00"})
    (line,) = _lines(stream)
    assert "object object" in str(line["obj"])
    assert str(line["big"]) == str(1 << 100)


def test_level_comes_from_blockx_log_level() -> None:
    stream = _configure(BLOCKX_LOG_LEVEL="WARNING")
    log = logging.getLogger("x")
    log.info("hidden")
    log.warning("shown")
    assert [line["msg"] for line in _lines(stream)] == ["shown"]
    stream = _configure(BLOCKX_LOG_LEVEL="debug")
    log.debug("now shown")
    assert [line["msg"] for line in _lines(stream)] == ["now shown"]


@pytest.mark.parametrize(
    ("text", "level"),
    [
        (None, logging.INFO),
        ("", logging.INFO),
        ("debug", logging.DEBUG),
        (" Error ", logging.ERROR),
        ("warn", logging.WARNING),
        ("critical", logging.CRITICAL),
        ("15", 15),
        ("loud", logging.INFO),
    ],
)
def test_parse_log_level(text: str | None, level: int) -> None:
    assert parse_log_level(text) == level


def test_text_format_is_one_plain_line() -> None:
    stream = _configure(BLOCKX_LOG_FORMAT="text")
    logging.getLogger("blockx.executor").info("started", extra={"callId": "c1", "pid": 42})
    (text,) = stream.getvalue().splitlines()
    assert "info" in text and "blockx.executor" in text and "started" in text
    assert "executorId=exec-7" in text and "callId=c1" in text and "pid=42" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_configuring_twice_replaces_the_handler() -> None:
    first = _configure()
    second = _configure()
    logging.getLogger("x").info("once")
    assert first.getvalue() == ""
    assert len(_lines(second)) == 1
    assert sum(h.get_name() == "blockx-executor" for h in logging.getLogger().handlers) == 1


def test_warnings_are_routed_to_the_log() -> None:
    import warnings

    stream = _configure()
    warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    lines = _lines(stream)
    assert any("deprecated thing" in str(line["msg"]) for line in lines)
