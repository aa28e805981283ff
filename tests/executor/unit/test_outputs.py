"""Outputs and failures: what a return value becomes on the wire, what a failure reports."""

from __future__ import annotations

import gc
import math
from textwrap import dedent
from typing import Any

import pytest
from executor_harness import Harness
from hypothesis import given
from hypothesis import strategies as st

from blockx.executor.errors import (
    REASON_BUDGET_EXHAUSTED,
    CallCancelledError,
    DeadlineSignalExpired,
)
from blockx.executor.outputs import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_ERROR_STACK_CHARS,
    MAX_LOCAL_VAR_REPR_CHARS,
    MAX_LOCAL_VARS,
    format_user_stack,
    round_half_even,
)
from blockx.wire import MAX_FRAME_BYTES, keys


def _run(h: Harness, body: str, args: Any = None) -> None:
    h.execute("c1", body, args)
    h.run()


class TestOutputs:
    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            ("{'a': 1}", {"a": 1}),
            ("[{'a': 1}, {'a': 2}]", [{"a": 1}, {"a": 2}]),
            ("None", None),
            ("2 ** 256 - 1", 2**256 - 1),
            ("-(2 ** 70)", -(2**70)),
            ("date(2026, 6, 10)", "2026-06-10"),
            ("datetime(2026, 6, 10, 9, 30)", "2026-06-10T09:30:00"),
            (
                "datetime(2026, 6, 10, 9, 30, tzinfo=__import__('datetime').timezone.utc)",
                "2026-06-10T09:30:00+00:00",
            ),
            ("{'nested': [1, 'two', 3.5, True, None]}", {"nested": [1, "two", 3.5, True, None]}),
            ("str(Decimal('1.10'))", "1.10"),
        ],
    )
    def test_values_the_wire_can_carry(self, h: Harness, expression: str, expected: Any) -> None:
        _run(h, f"def _(p):\n    return {expression}\n")
        assert h.output("c1") == expected

    def test_a_dataclass_is_converted(self, h: Harness) -> None:
        source = dedent(
            """
            import dataclasses

            @dataclasses.dataclass
            class Row:
                a: int
                b: str

            def _(p):
                return Row(1, "x")
            """
        )
        _run(h, source)
        assert h.output("c1") == {"a": 1, "b": "x"}

    def test_dataclass_outputs_do_not_keep_ended_tasks_namespaces_alive(
        self, make_harness: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        # Each task execs the module anew; the "asdict" warning once per class name must not
        # pin the class (and through it the task's namespace with its globals).
        source = dedent(
            """
            import dataclasses

            PINNED = bytearray(1_000_003)

            @dataclasses.dataclass
            class Row:
                a: int

            def _(p):
                return Row(p)
            """
        )
        h = make_harness(released_namespaces=0)
        with caplog.at_level("WARNING", logger="blockx.wire"):
            for i in range(5):
                h.execute(f"c{i}", source, i, task_id=f"task-{i}")
                h.run()
                assert h.output(f"c{i}") == {"a": i}
        gc.collect()
        alive = [o for o in gc.get_objects() if type(o) is bytearray and len(o) == 1_000_003]
        assert alive == []
        assert sum("dataclasses.asdict" in r.getMessage() for r in caplog.records) <= 1  # once

    @pytest.mark.parametrize(
        ("expression", "text"),
        [
            ("Decimal('1.5')", "Decimal"),
            ("{1, 2}", "set"),
            ("{'x': float('nan')}", "NaN"),
            ("[float('inf')]", "Infinity"),
            ("{1: 'int key'}", "key"),
            ("(i for i in range(3))", "generator"),
            ("b'bytes'", "bytes"),
        ],
    )
    def test_values_it_cannot_fail_as_output_not_serializable(
        self, h: Harness, expression: str, text: str
    ) -> None:
        _run(h, f"def _(p):\n    return {expression}\n")
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_OUTPUT_NOT_SERIALIZABLE
        assert failure[keys.FP_RETRYABLE] is False
        assert text in failure[keys.FP_ERROR_MESSAGE]

    def test_a_nan_in_a_debug_calls_output_is_refused_too(self, h: Harness) -> None:
        # With debug output the frame has no null of its own: the NaN check must still run.
        h.execute(
            "c1", "def _(p):\n    print('hi')\n    return {'x': float('nan')}\n", None, debug=True
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_OUTPUT_NOT_SERIALIZABLE
        assert "NaN" in failure[keys.FP_ERROR_MESSAGE]

    def test_an_output_too_large_for_a_frame_fails_only_that_call(self, h: Harness) -> None:
        _run(h, f"def _(p):\n    return 'x' * {MAX_FRAME_BYTES}\n")
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_PAYLOAD_TOO_LARGE
        assert failure[keys.FP_RETRYABLE] is False
        h.execute("c2", "def _(p):\n    return 'next'\n", None)
        h.run()
        assert h.output("c2") == "next"

    def test_a_large_output_under_the_limit_goes_out(self, h: Harness) -> None:
        size = MAX_FRAME_BYTES - 100_000
        _run(h, f"def _(p):\n    return 'y' * {size}\n")
        assert len(h.output("c1")) == size

    def test_completed_frames_carry_their_timings(self, h: Harness) -> None:
        _run(h, "def _(p):\n    clock.advance_ms(3)\n    return 1\n")
        payload = h.payload("c1")
        assert payload[keys.FP_BUDGET_USED_MS] == 3
        assert payload[keys.FP_EFFECTIVE_EXECUTION_DURATION_US] == 3000
        assert payload[keys.FP_QUEUE_WAIT_US] == 0
        assert payload[keys.FP_DEBUG_OUTPUT] is None
        assert payload[keys.FP_TASK_ID] == "t1"


class TestFailures:
    def test_system_exit_in_user_code_is_a_user_error(self, h: Harness) -> None:
        _run(h, "import sys\ndef _(p):\n    sys.exit(3)\n")
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_ERROR_MESSAGE] == "SystemExit: 3"

    def test_keyboard_interrupt_in_user_code_is_a_user_error(self, h: Harness) -> None:
        _run(h, "def _(p):\n    raise KeyboardInterrupt\n")
        assert h.failure("c1")[keys.FP_ERROR_MESSAGE] == "KeyboardInterrupt"

    def test_chained_exceptions_are_all_shown(self, h: Harness) -> None:
        source = dedent(
            """
            def _(p):
                try:
                    {}["missing"]
                except KeyError as exc:
                    raise ValueError("bad input") from exc
            """
        )
        _run(h, source)
        stack = h.failure("c1")[keys.FP_ERROR_STACK]
        assert stack.index("KeyError: 'missing'") < stack.index("ValueError: bad input")
        assert "direct cause of the following exception" in stack

    def test_local_vars_are_short_and_bounded(self, h: Harness) -> None:
        names = "\n".join(f"    v{i:02d} = {i}" for i in range(40))
        source = (
            dedent(
                """
            class Ugly:
                def __repr__(self):
                    raise RuntimeError("no repr")

            def _(p):
                long_text = "z" * 10_000
                ugly = Ugly()
            """
            )
            + names
            + "\n    raise ValueError('boom')\n"
        )
        _run(h, source)
        local_vars = h.failure("c1")[keys.FP_LOCAL_VARS]
        assert len(local_vars) == MAX_LOCAL_VARS + 1
        assert local_vars["…"] == f"{43 - MAX_LOCAL_VARS} more"  # p, long_text, ugly + 40
        assert len(local_vars["long_text"]) <= MAX_LOCAL_VAR_REPR_CHARS + 1
        assert local_vars["ugly"].startswith("<Ugly instance at 0x")  # its __repr__ raised
        assert local_vars["p"] == "None"

    def test_local_vars_come_from_the_innermost_user_frame(self, h: Harness) -> None:
        source = dedent(
            """
            def inner(x):
                y = x * 2
                return json.loads(y)

            def _(p):
                outer_only = 1
                return inner("{")
            """
        )
        _run(h, source)
        failure = h.failure("c1")
        assert failure[keys.FP_LOCAL_VARS] == {"x": "'{'", "y": "'{{'"}
        assert failure[keys.FP_ERROR_MESSAGE].startswith("JSONDecodeError")
        assert (
            "json/decoder.py" in failure[keys.FP_ERROR_STACK]
        )  # library frames after user code stay

    def test_huge_messages_and_stacks_are_truncated(self, h: Harness) -> None:
        source = dedent(
            """
            def deep(n):
                if n == 0:
                    raise ValueError("m" * 100_000)
                return deep(n - 1)

            def _(p):
                return deep(900)
            """
        )
        _run(h, source)
        failure = h.failure("c1")
        assert len(failure[keys.FP_ERROR_MESSAGE]) < MAX_ERROR_MESSAGE_CHARS + 100
        assert failure[keys.FP_ERROR_MESSAGE].endswith("characters]")
        assert len(failure[keys.FP_ERROR_STACK]) < MAX_ERROR_STACK_CHARS + 100
        assert failure[keys.FP_ERROR_STACK].startswith("[truncated")

    def test_a_failure_carries_the_budget_used(self, h: Harness) -> None:
        _run(h, "def _(p):\n    clock.advance_ms(7)\n    raise ValueError\n")
        assert h.failure("c1")[keys.FP_BUDGET_USED_MS] == 7


def test_a_call_the_executor_ended_is_named_by_what_happened_not_by_our_class_path() -> None:
    """The stack's last line says ``DeadlineExceeded`` / ``Cancelled``, as a user reads it,
    not ``blockx.executor.errors.DeadlineSignalExpired``."""
    code = compile("def _():\n    raise exc\n", "<blockx:f>", "exec")
    for exc, line in (
        (
            DeadlineSignalExpired(REASON_BUDGET_EXHAUSTED, used_ms=300.1, budget_ms=300),
            "DeadlineExceeded: call budget of 300 ms used up: 300.1 ms of CPU, sleeps, IO and "
            "sub-calls",
        ),
        (CallCancelledError("user_request"), "Cancelled: call cancelled: user_request"),
    ):
        namespace: dict[str, object] = {"exc": exc}
        exec(code, namespace)
        try:
            namespace["_"]()  # type: ignore[operator]
        except BaseException as raised:  # the framework signals are BaseException
            stack = format_user_stack(raised)
        assert stack.splitlines()[-1] == line, stack
        assert 'File "<blockx:f>", line 2' in stack


# --- round_half_even: the builtin round() of a float, in compiled code -----------------------

_TIES_AND_EDGES = [
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.5,
    -1.5,
    2.5,
    -2.5,
    0.49999999999999994,
    -0.49999999999999994,
    1e6 + 0.5,
    2.0**52 - 0.5,
    -(2.0**52) + 0.5,
    2.0**52,
    2.0**53 + 2,
    -(2.0**60),
    1e300,
    5e-324,
]


@pytest.mark.parametrize("x", _TIES_AND_EDGES)
def test_round_half_even_is_round_at_ties_and_edges(x: float) -> None:
    assert round_half_even(x) == round(x)
    assert type(round_half_even(x)) is int


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_round_half_even_is_round_for_every_finite_float(x: float) -> None:
    assert round_half_even(x) == round(x)


@given(st.integers(-(2**40), 2**40))
def test_round_half_even_is_round_at_every_half(n: int) -> None:
    x = n + 0.5
    assert round_half_even(x) == round(x)
    assert round_half_even(-x) == round(-x)


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_round_half_even_raises_as_round_for_nan_and_infinities(x: float) -> None:
    with pytest.raises((ValueError, OverflowError)) as expected:
        round(x)
    with pytest.raises(expected.type):
        round_half_even(x)
