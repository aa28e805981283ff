"""The SDK seam: provider installation, CallWaiting(io) shapes, sidecars, and the
RemoteCallError family mapped from ResumeCall.error."""

from __future__ import annotations

from textwrap import dedent

import pytest
from executor_harness import Harness

from blockx import sdk
from blockx.executor import sdk_bridge
from blockx.executor.outbox import Outbox
from blockx.executor.sdk_bridge import (
    FunctionCodeFetchError,
    RemoteCallError,
    RemoteIOError,
    SdkBridge,
    SubcallCycleDetectedError,
    SubcallDepthExceededError,
    SubcallFailedError,
    register_io_error_kinds,
)
from blockx.executor.sdk_bridge_provider import SdkBridgeProvider
from blockx.sdk.runtime import NoProviderError
from blockx.wire import MAX_FRAME_BYTES, keys


def _io(h: Harness, call_id: str = "c1") -> dict:  # type: ignore[type-arg]
    return h.last_wait(call_id)[keys.F_PAYLOAD]


class TestProvider:
    def test_outside_a_call_there_is_no_provider(self) -> None:
        with pytest.raises(NoProviderError, match="only work inside a call"):
            sdk.get_provider()
        assert sdk.current_provider() is None

    def test_inside_a_call_the_provider_is_the_bridge_provider(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx import sdk

            def _(p):
                provider = sdk.get_provider()
                return [type(provider).__name__, isinstance(provider, sdk.Provider)]
            """
        )
        h.execute("c1", source, None)
        h.run()
        assert h.output("c1") == ["SdkBridgeProvider", True]
        with pytest.raises(NoProviderError):
            sdk.get_provider()

    def test_context_variables_do_not_leak_between_calls_on_one_greenlet(self, h: Harness) -> None:
        source = dedent(
            """
            import contextvars

            VAR = contextvars.ContextVar("v", default="unset")

            def _(p):
                before = VAR.get()
                VAR.set(p)
                return before
            """
        )
        for i in range(3):
            h.execute(f"c{i}", source, i)
            h.run()
        assert [h.output(f"c{i}") for i in range(3)] == ["unset"] * 3
        assert h.rt.stats()["greenlets_created"] == 1

    def test_the_bridge_refuses_work_off_a_call_greenlet(self, h: Harness) -> None:
        bridge = SdkBridge(h.rt, Outbox(None))
        with pytest.raises(NoProviderError):
            bridge.do_read_req("blockdb", "get_row", {})
        with pytest.raises(NoProviderError):
            SdkBridgeProvider(bridge).sleep(1)


class TestIoWaits:
    def test_a_read(self, h: Harness) -> None:
        source = "from blockx import sdk\ndef _(p):\n    return sdk.get_provider().read_req('blockdb', 'get_row', {'k': 1}, cache_key='ck')\n"
        h.execute("c1", source, None)
        h.run()
        payload = _io(h)
        assert payload[keys.FP_WAIT_KIND] == keys.WAIT_IO
        assert payload[keys.FP_IO_KIND] == keys.IO_READ
        assert payload[keys.FP_BACKEND] == "blockdb"
        assert payload[keys.FP_OPERATION] == "get_row"
        assert payload[keys.FP_PARAMS] == {"k": 1}
        assert payload[keys.FP_CACHE_KEY] == "ck"
        assert payload[keys.FP_TASK_ID] == "t1"
        h.resume(h.last_wait("c1"), {"row": [1, 2]})
        h.run()
        assert h.output("c1") == {"row": [1, 2]}

    def test_a_write_is_never_cached(self, h: Harness) -> None:
        source = "from blockx.sdk import db\ndef _(p):\n    return db.write('upsert_rows', {'table': 't', 'rows': [p]})\n"
        h.execute("c1", source, {"id": 1})
        h.run()
        payload = _io(h)
        assert payload[keys.FP_IO_KIND] == keys.IO_WRITE
        assert payload[keys.FP_OPERATION] == "upsert_rows"
        assert payload[keys.FP_PARAMS] == {"table": "t", "rows": [{"id": 1}]}
        assert payload[keys.FP_CACHE_KEY] is None

    @pytest.mark.parametrize(("given", "sent"), [("", None), ("cap-1", "cap-1")])
    def test_a_capability_call(self, h: Harness, given: str, sent: str | None) -> None:
        source = f"from blockx import sdk\ndef _(p):\n    return sdk.get_provider().capability_req('oracle', 'price', {{'sym': p}}, cache_key={given!r})\n"
        h.execute("c1", source, "ETH")
        h.run()
        payload = _io(h)
        assert payload[keys.FP_IO_KIND] == keys.IO_CAPABILITY
        assert payload[keys.FP_BACKEND] == "oracle"
        assert payload[keys.FP_CACHE_KEY] == sent

    def test_sdk_db_and_rpc_entry_points(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db, rpc

            def _(p):
                return [db.get("prices", "ETH"), rpc.call("eth", "eth_getBalance", ["0xab", "latest"])]
            """
        )
        h.execute("c1", source, None)
        h.run()
        first = _io(h)
        assert (first[keys.FP_BACKEND], first[keys.FP_OPERATION]) == ("blockdb", "get_row")
        assert first[keys.FP_PARAMS] == {"table": "prices", "key": "ETH"}
        h.resume(h.last_wait("c1"), {"usd": 3000})
        h.run()
        second = _io(h)
        assert (second[keys.FP_BACKEND], second[keys.FP_OPERATION]) == ("rpc", "eth_getBalance")
        assert second[keys.FP_PARAMS] == {"chain": "eth", "params": ["0xab", "latest"]}
        h.resume(h.last_wait("c1"), 10**30)
        h.run()
        assert h.output("c1") == [{"usd": 3000}, 10**30]

    def test_a_mapping_that_is_not_a_dict_is_sent_as_an_object(self, h: Harness) -> None:
        source = "import types\nfrom blockx.sdk import db\ndef _(p):\n    return db.read('scan', types.MappingProxyType({'a': 1}))\n"
        h.execute("c1", source, None)
        h.run()
        assert _io(h)[keys.FP_PARAMS] == {"a": 1}

    @pytest.mark.parametrize(
        ("call", "text"),
        [
            ("db.read('scan', {'x': {1, 2}})", "NotSerializableError"),
            ("sdk.get_provider().read_req(1, 'op', {})", "TypeError"),
            ("sdk.get_provider().read_req('b', 'op', {}, cache_key=5)", "TypeError"),
            ("db.read('scan', {'x': float('nan')})", "NotSerializableError"),
            # the frame's other nulls differ with a cache key and for sub-calls (the
            # one-pass encoder counts them to spot a NaN orjson wrote as null)
            (
                "sdk.get_provider().read_req('b', 'op', {'x': float('nan')}, cache_key='k')",
                "NotSerializableError",
            ),
            ("sdk.get_provider().read_req('b', 'op', [float('inf')])", "NotSerializableError"),
            ("sdk.call_subfunc('child', {'x': float('nan')})", "NotSerializableError"),
        ],
    )
    def test_bad_requests_fail_at_the_call_site(self, h: Harness, call: str, text: str) -> None:
        h.execute(
            "c1",
            f"from blockx import sdk\nfrom blockx.sdk import db\ndef _(p):\n    return {call}\n",
            None,
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_USER_ERROR
        assert failure[keys.FP_ERROR_MESSAGE].startswith(text)
        assert h.waits("c1", keys.WAIT_IO) == []

    def test_a_request_too_large_for_a_frame_fails_as_payload_too_large(self, h: Harness) -> None:
        source = f"from blockx.sdk import db\ndef _(p):\n    return db.read('scan', {{'blob': 'x' * {MAX_FRAME_BYTES}}})\n"
        h.execute("c1", source, None)
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_PAYLOAD_TOO_LARGE
        assert failure[keys.FP_RETRYABLE] is False
        assert h.rt.inflight_count() == 0

    def test_a_failed_request_can_be_caught_and_the_call_goes_on(self, h: Harness) -> None:
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                try:
                    db.read("scan", {"x": {1}})
                except TypeError:
                    pass
                return db.get("t", 1)
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.resume(h.last_wait("c1"), "ok")
        h.run()
        assert h.output("c1") == "ok"


class TestSidecars:
    def test_bytes_params_travel_as_the_request_sidecar(self, h: Harness) -> None:
        source = "from blockx import sdk\ndef _(p):\n    return sdk.get_provider().read_req('blockdb', 'Query', b'\\x08\\x96\\x01')['data'].hex()\n"
        h.execute("c1", source, None)
        frames = h.pump()
        (envelope, sidecar) = frames[-1]
        assert envelope[keys.F_PAYLOAD][keys.FP_PARAMS] is None
        assert sidecar == b"\x08\x96\x01"
        h.resume(envelope, None, sidecar=b"\x01\x02")
        h.run()
        assert h.output("c1") == "0102"

    def test_a_sidecar_is_added_to_an_object_result(self, h: Harness) -> None:
        source = "from blockx.sdk import db\ndef _(p):\n    r = db.get('t', 1)\n    return [r['status'], r['data'].decode()]\n"
        h.execute("c1", source, None)
        h.run()
        h.resume(h.last_wait("c1"), {"status": 200}, sidecar=b"body")
        h.run()
        assert h.output("c1") == [200, "body"]

    def test_a_sidecar_with_a_non_object_result_fails_the_wait(self, h: Harness) -> None:
        source = "from blockx.sdk import db\ndef _(p):\n    return db.get('t', 1)\n"
        h.execute("c1", source, None)
        h.run()
        h.resume(h.last_wait("c1"), [1], sidecar=b"body")
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_INTERNAL_ERROR
        assert "sidecar needs an object result" in failure[keys.FP_ERROR_MESSAGE]


class TestRemoteErrors:
    @pytest.mark.parametrize("retryable", [True, False])
    def test_an_uncaught_io_error_fails_the_call_with_its_kind(
        self, h: Harness, retryable: bool
    ) -> None:
        source = "from blockx.sdk import db\ndef _(p):\n    return db.get('t', 1)\n"
        h.execute("c1", source, None)
        h.run()
        h.resume(
            h.last_wait("c1"),
            error={"kind": "io_error", "message": "backend down", "retryable": retryable},
        )
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == keys.ERR_IO_ERROR
        assert failure[keys.FP_RETRYABLE] is retryable
        assert failure[keys.FP_ERROR_MESSAGE] == "RemoteIOError: io_error: backend down"
        assert "return db.get('t', 1)" in failure[keys.FP_ERROR_STACK]
        assert "sdk_bridge.py" not in failure[keys.FP_ERROR_STACK]
        assert "db.py" not in failure[keys.FP_ERROR_STACK]

    def test_an_io_error_without_retryable_is_not_retryable(self, h: Harness) -> None:
        source = "from blockx.sdk import db\ndef _(p):\n    return db.get('t', 1)\n"
        h.execute("c1", source, None)
        h.run()
        h.resume(h.last_wait("c1"), error={"kind": "row_locked", "message": "busy"})
        h.run()
        failure = h.failure("c1")
        assert failure[keys.FP_ERROR_KIND] == "row_locked"
        assert failure[keys.FP_RETRYABLE] is False

    def test_registered_io_error_kinds_raise_their_own_class(
        self, h: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        class RowNotFound(RemoteIOError):
            pass

        monkeypatch.setattr(sdk_bridge, "_IO_ERROR_KINDS", {})

        register_io_error_kinds({"blockdb_row_not_found": RowNotFound})
        source = dedent(
            """
            from blockx.sdk import db

            def _(p):
                try:
                    return db.get("t", 1)
                except Exception as exc:
                    return [type(exc).__name__, exc.kind, exc.message, exc.retryable]
            """
        )
        h.execute("c1", source, None)
        h.run()
        h.resume(
            h.last_wait("c1"),
            error={"kind": "blockdb_row_not_found", "message": "no row 1", "retryable": False},
        )
        h.run()
        assert h.output("c1") == ["RowNotFound", "blockdb_row_not_found", "no row 1", False]
        assert sdk_bridge.io_error_class("blockdb_row_not_found") is RowNotFound

    def test_only_remote_call_errors_can_be_registered(self) -> None:
        with pytest.raises(TypeError):
            register_io_error_kinds({"bad": ValueError})  # type: ignore[dict-item]

    @pytest.mark.parametrize(
        ("wait_kind", "kind", "cls", "error_kind"),
        [
            (keys.WAIT_IO, "io_error", RemoteIOError, "io_error"),
            (keys.WAIT_SUBCALL, "user_error", SubcallFailedError, keys.ERR_SUBCALL_FAILED),
            (
                keys.WAIT_SUBCALL,
                keys.ERR_SUBCALL_DEPTH_EXCEEDED,
                SubcallDepthExceededError,
                keys.ERR_SUBCALL_DEPTH_EXCEEDED,
            ),
            (
                keys.WAIT_SUBCALL,
                keys.ERR_SUBCALL_CYCLE_DETECTED,
                SubcallCycleDetectedError,
                keys.ERR_SUBCALL_CYCLE_DETECTED,
            ),
            (
                keys.WAIT_FUNCTION_CODE,
                "not_found",
                FunctionCodeFetchError,
                keys.ERR_FUNCTION_CODE_FETCH_FAILED,
            ),
        ],
    )
    def test_map_resume_error(self, wait_kind: str, kind: str, cls: type, error_kind: str) -> None:
        error = sdk_bridge._map_resume_error(
            wait_kind, {"kind": kind, "message": "m", "retryable": True}
        )
        assert type(error) is cls
        assert isinstance(error, RemoteCallError) and isinstance(error, Exception)
        assert error.kind == kind and error.message == "m" and error.retryable is True
        assert error.error_kind == error_kind
