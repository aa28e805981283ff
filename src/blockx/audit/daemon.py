"""The audit daemon: verdicts over length-prefixed frames on stdin/stdout.

``python -m blockx.audit`` runs :func:`serve` on the process's standard
streams. Framing is :mod:`blockx.wire.frames`' (``uint32`` big-endian length,
then a JSON object, at most ``MAX_FRAME_BYTES``). One request, one response,
in order::

    → {"messageType": "AuditRequest", "requestId": 7, "functionId": "adder",
       "source": "def _(p): ..."}                      (messageType optional)
    ← {"messageType": "AuditVerdict", "requestId": 7, "functionId": "adder",
       "accepted": false, "verdictDigest": "sha256:…", "policy": "default",
       "entry": "_", "violations": [{"rule", "message", "line", "col"}]}

A request the daemon cannot serve — not JSON, not an object, a missing or
non-string ``functionId`` / ``source``, an unknown ``policy``, an oversized
frame (its body is skipped, so framing survives) — gets
``{"messageType": "AuditError", "requestId": …, "error": {"kind", "message"}}``
and the daemon reads on. End of input (even inside a frame) ends it with
status 0. Nothing else is ever written to stdout: :func:`main` points
``sys.stdout`` at stderr while serving.
"""

from __future__ import annotations

import logging
import struct
from typing import Any, BinaryIO, Final

from blockx.wire.frames import HEADER_SIZE, MAX_FRAME_BYTES, encode_frame
from blockx.wire.values import loads_wire

from .auditor import Auditor
from .tables import POLICY_NAME

__all__ = [
    "ERR_BAD_REQUEST",
    "ERR_FRAME_TOO_LARGE",
    "ERR_INTERNAL",
    "MT_AUDIT_ERROR",
    "MT_AUDIT_REQUEST",
    "MT_AUDIT_VERDICT",
    "handle_request",
    "serve",
]

_log = logging.getLogger("blockx.audit")

MT_AUDIT_REQUEST: Final = "AuditRequest"
MT_AUDIT_VERDICT: Final = "AuditVerdict"
MT_AUDIT_ERROR: Final = "AuditError"

ERR_BAD_REQUEST: Final = "bad_request"
ERR_FRAME_TOO_LARGE: Final = "frame_too_large"
ERR_INTERNAL: Final = "internal_error"

_U32 = struct.Struct(">I")
_SKIP_CHUNK: Final = 1 << 16


def _error(request_id: Any, kind: str, message: str) -> dict[str, Any]:
    return {
        "messageType": MT_AUDIT_ERROR,
        "requestId": request_id,
        "error": {"kind": kind, "message": message},
    }


def handle_request(body: bytes, auditor: Auditor) -> dict[str, Any]:
    """The response to one frame body; never raises."""
    try:
        request = loads_wire(body)
    except Exception as exc:
        return _error(None, ERR_BAD_REQUEST, f"request is not valid JSON: {exc}")
    if not isinstance(request, dict):
        return _error(None, ERR_BAD_REQUEST, "request must be a JSON object")
    request_id = request.get("requestId")
    function_id = request.get("functionId")
    source = request.get("source")
    policy = request.get("policy", POLICY_NAME)
    if not isinstance(function_id, str):
        return _error(request_id, ERR_BAD_REQUEST, "functionId must be a string")
    if not isinstance(source, str):
        return _error(request_id, ERR_BAD_REQUEST, "source must be a string")
    if policy != POLICY_NAME:
        return _error(request_id, ERR_BAD_REQUEST, f"unknown policy {policy!r}")
    try:
        verdict = auditor.audit(source, function_id)
    except Exception as exc:  # a checker bug must not end the daemon
        _log.exception("audit of %r failed", function_id)
        return _error(request_id, ERR_INTERNAL, f"{type(exc).__name__}: {exc}")
    response = verdict.to_wire(request_id)
    response["messageType"] = MT_AUDIT_VERDICT
    return response


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    chunks: list[bytes] = []
    missing = size
    while missing:
        chunk = stream.read(missing)
        if not chunk:
            break
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _skip(stream: BinaryIO, size: int) -> bool:
    while size:
        chunk = stream.read(min(size, _SKIP_CHUNK))
        if not chunk:
            return False
        size -= len(chunk)
    return True


def serve(stdin: BinaryIO, stdout: BinaryIO, auditor: Auditor | None = None) -> int:
    """Answer frames from ``stdin`` on ``stdout`` until end of input; returns 0."""
    auditor = auditor if auditor is not None else Auditor()
    while True:
        header = _read_exact(stdin, HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            if header:
                _log.warning("input ended inside a frame header")
            return 0
        (size,) = _U32.unpack(header)
        if size > MAX_FRAME_BYTES:
            if not _skip(stdin, size):
                return 0
            response = _error(
                None, ERR_FRAME_TOO_LARGE, f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}"
            )
        else:
            body = _read_exact(stdin, size)
            if len(body) < size:
                _log.warning("input ended inside a frame body")
                return 0
            response = handle_request(body, auditor)
        try:
            stdout.write(encode_frame(response))
            stdout.flush()
        except (BrokenPipeError, ValueError):  # the reader is gone (ValueError: closed)
            return 0
