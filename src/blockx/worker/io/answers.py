"""The values an IO request and its answer travel in: :class:`IOResult`,
:class:`PreparedRequest` and :class:`Reply`.

They live in a module of their own so that they are compiled (mypyc: see
``setup.py``) while the modules that define the interfaces -- ``handler``
(``IOHandler``) and ``backend`` (``IOBackend``), runtime-checkable Protocols that
stay interpreted -- re-export them. Every read builds several of them (a
``PreparedRequest``, the backend's ``Reply``, one or two ``IOResult``), and the
worker reads their attributes per wait: as native classes their construction
and attribute reads run in C. They behave as the plain classes they replace:
keyword arguments, ``repr``, equality (``IOResult``), no extra attributes. Do not
subclass them: a compiled class takes no interpreted subclass. Compiled, their
fields are checked against the annotations when set -- ``budget_used_ms`` and
``nbytes`` an ``int``, ``sidecar`` ``bytes`` (not a ``bytearray`` or a view),
``domain`` a ``str`` or None, ``cacheable`` a ``bool`` -- so a handler or backend
passing something else gets a ``TypeError`` at construction (the worker needs
those types anyway, and would refuse the value later).
"""

from __future__ import annotations

from typing import Any, Final

from blockx.wire import RemoteError, keys

__all__ = ["IOResult", "PreparedRequest", "Reply"]

_ERR_IO_ERROR: Final = keys.ERR_IO_ERROR


class IOResult:
    """The answer to one IO wait: a result or an error, plus what it cost.

    ``result`` is any JSON value (with a ``sidecar`` it must be an object or
    ``None``; the executor adds the bytes as ``result["data"]``). ``error`` set
    means the wait failed: the executor raises it in user code (uncaught, the
    call fails with its kind and ``retryable`` flag). ``budget_used_ms`` is
    charged to the call's budget; ``None``: the wall time of the request.

    ``immutable``: the answer never changes (a chain read at a block number or
    hash); the executor may keep it and answer identical reads of the task
    itself (docs/protocol.md, ``ResumeCall.immutable``).

    Treat it as immutable: a cached one answers many waits.
    """

    __slots__ = ("budget_used_ms", "error", "immutable", "result", "sidecar")

    result: Any
    error: RemoteError | None
    #: Raw response bytes (a protobuf, a JSON-RPC body), sent without base64.
    sidecar: bytes | None
    budget_used_ms: int | None
    immutable: bool

    def __init__(
        self,
        *,
        result: Any = None,
        error: RemoteError | None = None,
        sidecar: bytes | None = None,
        budget_used_ms: int | None = None,
        immutable: bool = False,
    ) -> None:
        self.result = result
        self.error = error
        self.sidecar = sidecar
        self.budget_used_ms = budget_used_ms
        self.immutable = immutable

    def __repr__(self) -> str:
        tail = ", immutable=True" if self.immutable else ""
        return (
            f"IOResult(result={self.result!r}, error={self.error!r}, "
            f"sidecar={self.sidecar!r}, budget_used_ms={self.budget_used_ms!r}{tail})"
        )

    def __eq__(self, other: object) -> bool:
        # As a dataclass compares: another type decides for itself; fields as one tuple
        # (identity first, so a result holding a NaN still equals itself).
        if type(other) is not IOResult:
            return NotImplemented
        return (self.result, self.error, self.sidecar, self.budget_used_ms, self.immutable) == (
            other.result,
            other.error,
            other.sidecar,
            other.budget_used_ms,
            other.immutable,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as a dataclass)


class PreparedRequest:
    """A checked request, ready for :meth:`IOBackend.execute <blockx.worker.io.backend.IOBackend>`.

    ``domain`` groups requests for write invalidation: a write to a domain
    drops the task's cached reads of the same backend and domain (``None``: the
    whole backend). ``cacheable`` False keeps a read's answer out of the cache
    (identical concurrent reads still share one backend call). ``immutable``
    True says a successful answer never changes, whoever writes what (a chain
    read at a block number or hash; never a table read): the executor may then
    keep it and answer identical reads itself. ``body`` is the backend's own
    parsed form of the request.
    """

    __slots__ = ("body", "cacheable", "domain", "immutable", "operation")

    operation: str
    body: Any
    domain: str | None
    cacheable: bool
    immutable: bool

    def __init__(
        self,
        operation: str,
        body: Any,
        *,
        domain: str | None,
        cacheable: bool = True,
        immutable: bool = False,
    ) -> None:
        self.operation = operation
        self.body = body
        self.domain = domain
        self.cacheable = cacheable
        self.immutable = immutable and cacheable

    def __repr__(self) -> str:
        tail = ", immutable=True" if self.immutable else ""
        return (
            f"PreparedRequest({self.operation!r}, domain={self.domain!r}, "
            f"cacheable={self.cacheable}{tail})"
        )


class Reply:
    """A backend's answer: a JSON ``result`` (and optional raw ``sidecar``) or an ``error``.

    ``nbytes`` estimates the answer's size (the cache's byte bound uses it); 0
    lets the cache estimate it from ``result``. ``throttled``: a rate limit slowed
    the request down (the ``rpc`` backend's; the task's statistics count it).
    """

    __slots__ = ("error", "nbytes", "result", "sidecar", "throttled")

    result: Any
    sidecar: bytes | None
    error: RemoteError | None
    nbytes: int
    throttled: bool

    def __init__(
        self,
        result: Any = None,
        *,
        sidecar: bytes | None = None,
        error: RemoteError | None = None,
        nbytes: int = 0,
        throttled: bool = False,
    ) -> None:
        self.result = result
        self.sidecar = sidecar
        self.error = error
        self.nbytes = nbytes
        self.throttled = throttled

    def marked_throttled(self) -> Reply:
        """This answer, for a request a rate limit slowed down (a copy: replies are shared)."""
        return Reply(
            self.result, sidecar=self.sidecar, error=self.error, nbytes=self.nbytes, throttled=True
        )

    @classmethod
    def failure(cls, message: str, *, retryable: bool, kind: str = _ERR_IO_ERROR) -> Reply:
        return cls(error=RemoteError(kind=kind, message=message, retryable=retryable))

    def to_io_result(self, budget_used_ms: int | None = None) -> IOResult:
        return IOResult(
            result=self.result,
            error=self.error,
            sidecar=self.sidecar,
            budget_used_ms=budget_used_ms,
        )

    def __repr__(self) -> str:
        if self.error is not None:
            return f"Reply(error={self.error!r})"
        return f"Reply(nbytes={self.nbytes}, sidecar={self.sidecar is not None})"
