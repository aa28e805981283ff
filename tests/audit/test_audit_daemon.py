"""The audit daemon (frames on stdin/stdout) and AuditDaemonClient (asyncio, child process)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import struct
import subprocess
import sys
from typing import Any

import pytest

from blockx.audit import AuditDaemonClient, AuditDaemonError, Auditor
from blockx.audit.daemon import serve
from blockx.wire.frames import MAX_FRAME_BYTES, FrameDecoder, encode_frame

GOOD = "def _(p):\n    return p\n"
BAD = "import os\ndef _(p):\n    return os.system('id')\n"


def request(request_id: Any, source: str = GOOD, function_id: str = "t/fn", **extra: Any) -> bytes:
    body = {"requestId": request_id, "functionId": function_id, "source": source, **extra}
    return encode_frame(body)


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def run_serve(data: bytes) -> tuple[int, list[dict[str, Any]]]:
    out = io.BytesIO()
    code = serve(io.BytesIO(data), out, Auditor())
    frames = FrameDecoder().feed(out.getvalue())
    return code, [frame.envelope for frame in frames]


class TestServe:
    def test_one_response_per_request_in_order(self) -> None:
        code, responses = run_serve(request(1) + request("two", BAD) + request(3))
        assert code == 0
        assert [r["requestId"] for r in responses] == [1, "two", 3]
        assert [r["messageType"] for r in responses] == ["AuditVerdict"] * 3
        assert [r["accepted"] for r in responses] == [True, False, True]
        first, second, _ = responses
        assert first["entry"] == "_" and first["violations"] == []
        assert first["verdictDigest"].startswith("sha256:")
        assert second["violations"][0]["rule"] == "import.module"
        assert set(second) == {
            "messageType", "requestId", "functionId", "accepted", "verdictDigest",
            "policy", "entry", "violations",
        }  # fmt: skip

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b"not json", "not valid JSON"),
            (b"[1, 2]", "JSON object"),
            (b'{"requestId": 5, "source": "x"}', "functionId"),
            (b'{"requestId": 5, "functionId": "f", "source": 3}', "source"),
            (b'{"requestId": 5, "functionId": "f", "source": "", "policy": "lax"}', "policy"),
            (b"\xff\xfe", "not valid JSON"),
        ],
    )
    def test_bad_requests_get_an_error_and_the_daemon_reads_on(
        self, body: bytes, message: str
    ) -> None:
        code, responses = run_serve(raw_frame(body) + request(9))
        assert code == 0
        error, verdict = responses
        assert error["messageType"] == "AuditError"
        assert error["error"]["kind"] == "bad_request"
        assert message in error["error"]["message"]
        assert verdict["requestId"] == 9 and verdict["accepted"] is True

    def test_an_oversized_frame_is_skipped_and_answered(self) -> None:
        size = MAX_FRAME_BYTES + 1
        data = struct.pack(">I", size) + b" " * size + request(2)
        code, responses = run_serve(data)
        assert code == 0
        assert responses[0]["error"]["kind"] == "frame_too_large"
        assert responses[1]["requestId"] == 2

    @pytest.mark.parametrize("cut", [0, 2, 4, 10])
    def test_end_of_input_anywhere_ends_cleanly(self, cut: int) -> None:
        whole = request(1)
        code, responses = run_serve(request(0) + whole[:cut])
        assert code == 0
        assert [r["requestId"] for r in responses] == [0]

    def test_a_checker_bug_is_answered_not_fatal(self, monkeypatch: pytest.MonkeyPatch) -> None:
        auditor = Auditor()

        def broken(source: str, function_id: str) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(auditor, "audit", broken)
        out = io.BytesIO()
        assert serve(io.BytesIO(request(1) + request(2)), out, auditor) == 0
        responses = [f.envelope for f in FrameDecoder().feed(out.getvalue())]
        assert [r["error"]["kind"] for r in responses] == ["internal_error"] * 2


class TestDaemonProcess:
    def test_python_m_blockx_audit_speaks_frames_and_exits_on_eof(self) -> None:
        data = request(1) + raw_frame(b"garbage") + request(2, BAD)
        proc = subprocess.run(
            [sys.executable, "-m", "blockx.audit"],
            input=data,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        responses = [f.envelope for f in FrameDecoder().feed(proc.stdout)]
        assert [r["messageType"] for r in responses] == [
            "AuditVerdict",
            "AuditError",
            "AuditVerdict",
        ]
        assert [r.get("accepted") for r in responses] == [True, None, False]

    def test_check_and_print_tables(self, tmp_path: Any) -> None:
        path = tmp_path / "adder.py"
        path.write_text("def adder(p):\n    return p\n")
        proc = subprocess.run(
            [sys.executable, "-m", "blockx.audit", "--check", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0 and '"entry": "adder"' in proc.stdout
        proc = subprocess.run(
            [sys.executable, "-m", "blockx.audit", "--print-tables"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0 and "| `json` | `dumps`, `loads` |" in proc.stdout


class TestClient:
    def test_audits_concurrently_caches_and_closes(self) -> None:
        async def main() -> None:
            async with AuditDaemonClient() as client:
                pid = client.pid
                assert pid is not None
                sources = [f"def _(p):\n    return {i}\n" for i in range(20)] + [BAD]
                verdicts = await asyncio.gather(*(client.audit(s, "t/fn") for s in sources))
                assert [v.accepted for v in verdicts] == [True] * 20 + [False]
                assert verdicts[-1].violations[0].rule == "import.module"
                assert verdicts[0].entry == "_" and verdicts[0].function_id == "t/fn"
                again = await client.audit(sources[0], "t/fn")
                assert again == verdicts[0] and client.cache_hits == 1
                assert verdicts[0] == Auditor().audit(sources[0], "t/fn")
            assert client.pid is None
            with pytest.raises(RuntimeError):
                await client.audit("def _(p): pass\n", "x")
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)

        asyncio.run(main())

    def test_a_dead_daemon_fails_its_audits_and_is_restarted(self) -> None:
        async def main() -> None:
            client = AuditDaemonClient()
            try:
                assert (await client.audit(GOOD, "a")).accepted
                pid = client.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                for _ in range(100):
                    if client.pid is None:
                        break
                    await asyncio.sleep(0.01)
                verdict = await client.audit("def _(p):\n    return 2\n", "a")
                assert verdict.accepted and client.restarts == 1
                assert client.pid not in (None, pid)
            finally:
                await client.close()

        asyncio.run(main())

    def test_a_pending_audit_fails_when_the_daemon_dies(self) -> None:
        async def main() -> None:
            # A "daemon" that reads a request and exits without answering.
            command = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(4); sys.exit(3)"]
            client = AuditDaemonClient(command=command)
            try:
                with pytest.raises(AuditDaemonError) as info:
                    await client.audit(GOOD, "a")
                assert info.value.kind == "daemon_exited"
            finally:
                await client.close()

        asyncio.run(main())

    def test_a_silent_daemon_times_out_and_is_killed(self) -> None:
        async def main() -> None:
            command = [sys.executable, "-c", "import time; time.sleep(60)"]
            client = AuditDaemonClient(command=command, request_timeout_s=0.3)
            try:
                with pytest.raises(AuditDaemonError) as info:
                    await client.audit(GOOD, "a")
                assert info.value.kind == "timeout"
            finally:
                await client.close()

        asyncio.run(main())

    def test_non_str_input_is_refused_before_the_daemon(self) -> None:
        async def main() -> None:
            async with AuditDaemonClient() as client:
                with pytest.raises(TypeError):
                    await client.audit(None, "a")  # type: ignore[arg-type]

        asyncio.run(main())
