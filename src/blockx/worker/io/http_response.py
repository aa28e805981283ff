"""The response side of ``blockx.worker.io.http_client``: its errors and a sans-IO
HTTP/1.x response parser.

Theory of operation
-------------------
:class:`ResponseParser` takes bytes as they arrive (``feed``) and the end of the
stream (``feed_eof``); it never reads a socket or a clock. The head ends at the
first ``\\r\\n\\r\\n`` (at most :data:`MAX_HEAD_BYTES`, checked before parsing);
header names are compared case-insensitively and only the five it needs are read
(``Content-Length``, ``Transfer-Encoding``, ``Connection``, ``Content-Encoding``, and
``Retry-After``, kept as text for the ``rpc`` backend's rate limits).
The body is delimited by ``Transfer-Encoding: chunked``, else ``Content-Length``,
else the end of the stream (then ``keep_alive`` is false). 1xx responses are
skipped; 204 and 304 have no body. A malformed response raises
:class:`MalformedResponseError`; a stream that ends early,
:class:`ServerDisconnectedError`. One parser per response; the connection
(``http_client._Connection``) makes a new one for each request.

Errors: :class:`HttpClientError` is the root. The caller misused the client:
:class:`InvalidURLError`, :class:`ClientClosedError`. The peer misbehaved:
:class:`MalformedResponseError`, :class:`ServerDisconnectedError`.
"""

from __future__ import annotations

import zlib
from typing import Final

__all__ = [
    "MAX_HEAD_BYTES",
    "ClientClosedError",
    "HttpClientError",
    "InvalidURLError",
    "MalformedResponseError",
    "ResponseParser",
    "ServerDisconnectedError",
    "decode_body",
]

#: Longest response head (status line + headers) accepted.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Longest chunk-size or trailer line accepted.
_MAX_LINE_BYTES: Final = 8 * 1024


class HttpClientError(Exception):
    """Root of this client's errors."""


class InvalidURLError(HttpClientError, ValueError):
    """The caller passed a URL this client cannot send to."""


class ClientClosedError(HttpClientError, RuntimeError):
    """``post`` after :meth:`HttpClient.close`."""


class MalformedResponseError(HttpClientError):
    """The server's answer is not valid HTTP/1.x."""


class ServerDisconnectedError(HttpClientError, ConnectionError):
    """The server closed the connection before its response ended."""


# --- the response parser (sans-IO) -------------------------------------------------------------

_HEAD: Final = 0
_LENGTH: Final = 1
_CHUNK_SIZE: Final = 2
_CHUNK_DATA: Final = 3
_TRAILER: Final = 4
_UNTIL_CLOSE: Final = 5
_DONE: Final = 6
_STATE_NAMES: Final = (
    "head",
    "length",
    "chunk-size",
    "chunk-data",
    "trailer",
    "until-close",
    "done",
)
_HEX_DIGITS: Final = frozenset(b"0123456789abcdefABCDEF")
#: The response headers this client reads (a folded line may not continue them).
_INTERPRETED: Final = frozenset(
    (b"content-length", b"transfer-encoding", b"connection", b"content-encoding")
)


class ResponseParser:
    """Parses one HTTP/1.x response from the bytes fed to it (see the module docstring).

    ``feed`` raises :class:`MalformedResponseError` on a bad response, leaving the
    parser unusable. Once :attr:`done`, :attr:`status`, :attr:`body` and
    :attr:`keep_alive` hold the answer and :attr:`extra` whether bytes followed it.
    """

    __slots__ = (
        "_buffer",
        "_parts",
        "_remaining",
        "_state",
        "body",
        "content_encoding",
        "extra",
        "keep_alive",
        "received_any",
        "retry_after",
        "status",
    )

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._parts: list[bytes] = []
        #: Bytes left of the body (``_LENGTH``) or of the chunk and its CRLF (``_CHUNK_DATA``).
        self._remaining = 0
        self._state = _HEAD
        self.status = 0
        self.body = b""
        self.keep_alive = False
        self.content_encoding = ""
        #: The ``Retry-After`` header's value ("" when absent).
        self.retry_after = ""
        #: Whether any byte arrived (a failure before the first one may be retried).
        self.received_any = False
        #: Whether bytes arrived after the response ended (the connection is not reused).
        self.extra = False

    def __repr__(self) -> str:
        return (
            f"ResponseParser({_STATE_NAMES[self._state]}, status={self.status}, "
            f"buffered={len(self._buffer)}, keep_alive={self.keep_alive})"
        )

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bool:
        """Take ``data``; answer whether the response is complete."""
        if data:
            self.received_any = True
        if self._state == _DONE:
            self.extra = self.extra or bool(data)
            return True
        buffer = self._buffer
        buffer += data
        while True:
            state = self._state
            if state == _LENGTH:
                take = min(self._remaining, len(buffer))
                if take:
                    self._parts.append(bytes(buffer[:take]))
                    del buffer[:take]
                    self._remaining -= take
                if self._remaining:
                    return False
                self._finish()
            elif state == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise MalformedResponseError(
                            f"the response head is longer than {MAX_HEAD_BYTES} bytes"
                        )
                    return False
                if end > MAX_HEAD_BYTES:
                    raise MalformedResponseError(
                        f"the response head is longer than {MAX_HEAD_BYTES} bytes"
                    )
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                self._parse_head(head)
            elif state == _UNTIL_CLOSE:
                if buffer:
                    self._parts.append(bytes(buffer))
                    buffer.clear()
                return False
            elif state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > _MAX_LINE_BYTES:
                        raise MalformedResponseError("a chunk-size line is too long")
                    return False
                line = bytes(buffer[:end]).partition(b";")[0].strip()
                del buffer[: end + 2]
                if not line or len(line) > 16 or not _HEX_DIGITS.issuperset(line):
                    raise MalformedResponseError(f"bad chunk size {line[:40]!r}")
                size = int(line, 16)
                if size:
                    self._remaining = size + 2
                    self._state = _CHUNK_DATA
                else:
                    self._state = _TRAILER
            elif state == _CHUNK_DATA:
                if len(buffer) < self._remaining:
                    if len(buffer) > 2:  # keep the data, never the CRLF (it may be split)
                        take = min(len(buffer), self._remaining - 2)
                        self._parts.append(bytes(buffer[:take]))
                        del buffer[:take]
                        self._remaining -= take
                    return False
                size = self._remaining - 2
                if buffer[size : size + 2] != b"\r\n":
                    raise MalformedResponseError("a chunk does not end with CRLF")
                if size:
                    self._parts.append(bytes(buffer[:size]))
                del buffer[: size + 2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > _MAX_LINE_BYTES:
                        raise MalformedResponseError("a trailer line is too long")
                    return False
                del buffer[: end + 2]
                if end == 0:
                    self._finish()
            else:  # _DONE
                self.extra = bool(buffer)
                buffer.clear()
                return True

    def feed_eof(self) -> bool:
        """The server closed the connection: answer whether that completed the response
        (a read-to-close body); raise :class:`ServerDisconnectedError` if it cut it short."""
        if self._state == _UNTIL_CLOSE:
            self._finish()
            return True
        if self._state == _DONE:
            return True
        if not self.received_any:
            raise ServerDisconnectedError("the server closed the connection without answering")
        raise ServerDisconnectedError(
            f"the server closed the connection in the middle of the response "
            f"({_STATE_NAMES[self._state]})"
        )

    def _finish(self) -> None:
        parts = self._parts
        self.body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._parts = []
        self._state = _DONE

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        version, _, rest = status_line.partition(b" ")
        code = rest[:3]
        if (
            version not in (b"HTTP/1.1", b"HTTP/1.0")
            or len(code) != 3
            or not code.isdigit()
            or rest[3:4] not in (b"", b" ")
        ):
            raise MalformedResponseError(f"bad status line {status_line[:80]!r}")
        status = int(code)
        length = -1
        chunked = False
        other_coding = False
        close = version == b"HTTP/1.0"
        encoding = ""
        retry_after = ""
        name = b""
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):  # obsolete line folding continues the header before
                if not name or name in _INTERPRETED:
                    raise MalformedResponseError(f"bad header line {line[:80]!r}")
                continue  # the folded header is one we do not read
            raw_name, colon, raw_value = line.partition(b":")
            if not colon or not raw_name or raw_name != raw_name.strip():
                raise MalformedResponseError(f"bad header line {line[:80]!r}")
            name = raw_name.lower()
            if name == b"content-length":
                value = raw_value.strip()
                if not value.isdigit() or (length >= 0 and int(value) != length):
                    raise MalformedResponseError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                codings = [c.strip() for c in raw_value.lower().split(b",")]
                chunked = codings[-1] == b"chunked"
                other_coding = not chunked
            elif name == b"connection":
                tokens = {t.strip() for t in raw_value.lower().split(b",")}
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens and version == b"HTTP/1.0":
                    close = False
            elif name == b"content-encoding":
                encoding = raw_value.strip().lower().decode("latin-1")
            elif name == b"retry-after":
                retry_after = raw_value.strip().decode("latin-1")
        if 100 <= status < 200:
            return  # an interim response: the real one follows (state stays _HEAD)
        self.status = status
        self.content_encoding = "" if encoding == "identity" else encoding
        self.retry_after = retry_after
        self.keep_alive = not close
        if status in (204, 304):
            self._finish()
        elif chunked:
            self._state = _CHUNK_SIZE
        elif other_coding or length < 0:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE
        elif length:
            self._remaining = length
            self._state = _LENGTH
        else:
            self._finish()


def decode_body(body: bytes, encoding: str) -> bytes:
    """Undo a ``Content-Encoding`` (we ask for gzip or deflate, as aiohttp did)."""
    try:
        if encoding in ("gzip", "x-gzip"):
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:  # raw deflate, as some servers send
                return zlib.decompress(body, -zlib.MAX_WBITS)
    except zlib.error as exc:
        raise MalformedResponseError(f"the {encoding} body does not decompress: {exc}") from exc
    raise MalformedResponseError(f"unsupported Content-Encoding {encoding!r}")
