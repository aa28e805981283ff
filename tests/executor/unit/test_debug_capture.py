"""Debug capture: stdout/stderr of a debug call become CallCompleted.debugOutput."""

from __future__ import annotations

import sys
from textwrap import dedent

import pytest
from executor_harness import Harness

from blockx.executor.context import DebugCapture
from blockx.executor.debug_capture import DebugTee, ensure_debug_tee, remove_debug_tee
from blockx.wire import keys

PRINTS = dedent(
    """
    import sys

    def _(p):
        print("out", p)
        print("err", p, file=sys.stderr)
        sys.stdout.write("raw\\n")
        return p
    """
)
PRINT_AROUND_WAIT = dedent(
    """
    from blockx.sdk import db

    def _(p):
        print("before", p)
        db.get("t", p)
        print("after", p)
        return p
    """
)


class TestDebugCalls:
    def test_a_debug_call_returns_what_it_printed(
        self, h: Harness, capsys: pytest.CaptureFixture[str]
    ) -> None:
        h.execute("c1", PRINTS, 1, debug=True)
        h.run()
        assert h.payload("c1")[keys.FP_DEBUG_OUTPUT] == "out 1\nerr 1\nraw\n"
        captured = capsys.readouterr()  # the tee still writes through
        assert "out 1\nraw\n" in captured.out
        assert "err 1\n" in captured.err

    def test_a_call_without_debug_has_no_debug_output(self, h: Harness) -> None:
        h.execute("c1", PRINTS, 1)
        h.run()
        assert h.payload("c1")[keys.FP_DEBUG_OUTPUT] is None

    def test_interleaved_calls_each_keep_their_own_output(self, h: Harness) -> None:
        h.execute("a", PRINT_AROUND_WAIT, "A", debug=True)
        h.execute("b", PRINT_AROUND_WAIT, "B", debug=True)
        h.execute("quiet", PRINT_AROUND_WAIT, "Q")
        h.run()
        for call_id in ("b", "quiet", "a"):
            h.resume(h.last_wait(call_id), None)
            h.run()
        assert h.payload("a")[keys.FP_DEBUG_OUTPUT] == "before A\nafter A\n"
        assert h.payload("b")[keys.FP_DEBUG_OUTPUT] == "before B\nafter B\n"
        assert h.payload("quiet")[keys.FP_DEBUG_OUTPUT] is None

    def test_writes_outside_the_call_are_not_captured(self, h: Harness) -> None:
        h.execute("a", PRINT_AROUND_WAIT, "A", debug=True)
        h.run()
        print("scheduler noise")
        h.resume(h.last_wait("a"), None)
        h.run()
        assert "noise" not in h.payload("a")[keys.FP_DEBUG_OUTPUT]

    def test_debug_output_is_bounded(self, h: Harness) -> None:
        source = "import sys\ndef _(p):\n    sys.stdout.write('x' * (DebugCapture_LIMIT + 10))\n"
        h.execute(
            "c1",
            source.replace("DebugCapture_LIMIT", str(DebugCapture.DEFAULT_LIMIT)),
            None,
            debug=True,
        )
        h.run()
        output = h.payload("c1")[keys.FP_DEBUG_OUTPUT]
        assert output.startswith("x" * 1000)
        assert output.endswith("[debug output truncated: 10 more characters]")

    def test_a_failed_debug_call_still_fails_normally(self, h: Harness) -> None:
        h.execute(
            "c1", "def _(p):\n    print('about to fail')\n    raise KeyError(p)\n", "k", debug=True
        )
        h.run()
        assert h.failure("c1")[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR


class TestTee:
    def test_the_tee_is_installed_once_and_again_after_replacement(self) -> None:
        original = sys.stdout
        try:
            ensure_debug_tee()
            tee = sys.stdout
            assert isinstance(tee, DebugTee) and tee.wrapped is original
            ensure_debug_tee()
            assert sys.stdout is tee
            sys.stdout = original
            ensure_debug_tee()
            assert isinstance(sys.stdout, DebugTee)
            assert sys.stdout.encoding == original.encoding  # attributes pass through
            sys.stdout.writelines(["a", "b"])
            sys.stdout.flush()
        finally:
            remove_debug_tee()
        assert sys.stdout is original

    def test_debug_capture_limits(self) -> None:
        capture = DebugCapture(limit=5)
        capture.write("abc")
        capture.write("defg")
        capture.write("h")
        assert capture.getvalue() == "abcde\n…[debug output truncated: 3 more characters]"
        assert capture.truncated == 3
