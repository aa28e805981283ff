"""The fake chain of :mod:`blockx.testing`: canned JSON-RPC answers for ``ChainState``.

``ChainState`` (and ``blockx.sdk.rpc.call``) send each JSON-RPC request as a
read of the ``rpc`` backend: ``(method, params)`` on a chain. A
:class:`FakeChain` answers it from

* a dict: ``{(method, params): result}`` — ``params`` a list or tuple, compared
  as JSON (so ``("eth_getBalance", ("0xab...", "0x10"))`` matches the list the
  SDK sends; dicts inside compare by content); a key that is just the method
  name answers that method whatever its params; a key ``(chain, method,
  params)`` answers only that chain;
* or a callable ``answer(method, params)`` (params a list) returning the result.

An answer that is an exception instance (or a callable that raises) is raised
in the function, as a node error would be: raise
``RemoteIOError("io_error", "execution reverted")`` to act out a revert. A
request nobody answers raises :class:`UnansweredRequestError` (a
``RemoteIOError``) whose message shows the exact key to add.

Block numbers travel as the SDK sends them: ``ChainState("eth", 16)`` asks at
``"0x10"``. :attr:`FakeChain.requests` records every ``(chain, method,
params)`` asked, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blockx.executor.errors import RemoteIOError
from blockx.wire import dumps_wire, keys

__all__ = ["ChainAnswers", "FakeChain", "UnansweredRequestError"]

#: What ``load_function(chain=...)`` takes.
ChainAnswers = Mapping[Any, Any] | Callable[[str, list[Any]], Any]


class UnansweredRequestError(RemoteIOError):
    """A request the test environment has no answer for (kind ``io_error``)."""

    def __init__(self, message: str) -> None:
        super().__init__(keys.ERR_IO_ERROR, message, False)


def _canonical(params: Any) -> str:
    """A JSON text comparing equal for equal params (tuples as lists, dict keys sorted)."""
    if isinstance(params, tuple):
        params = list(params)
    return dumps_wire(_sorted(params)).decode()


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


class FakeChain:
    """Canned answers for the ``rpc`` backend (see the module docstring)."""

    __slots__ = ("_answer", "_by_chain", "_by_method", "_by_params", "requests")

    def __init__(self, answers: ChainAnswers | None = None) -> None:
        self._answer: Callable[[str, list[Any]], Any] | None = None
        self._by_params: dict[tuple[str, str], Any] = {}
        self._by_chain: dict[tuple[str, str, str], Any] = {}
        self._by_method: dict[str, Any] = {}
        self.requests: list[tuple[str, str, list[Any]]] = []
        if answers is None:
            return
        if callable(answers) and not isinstance(answers, Mapping):
            self._answer = answers
            return
        for key, result in answers.items():
            self.add(key, result)

    def __repr__(self) -> str:
        known = len(self._by_params) + len(self._by_chain) + len(self._by_method)
        source = "callable" if self._answer is not None else f"{known} answers"
        return f"FakeChain({source}, requests={len(self.requests)})"

    def add(self, key: Any, result: Any) -> None:
        """Answer ``key`` (a method, ``(method, params)`` or ``(chain, method, params)``)."""
        if isinstance(key, str):
            self._by_method[key] = result
        elif isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
            self._by_params[(key[0], _canonical(key[1]))] = result
        elif isinstance(key, tuple) and len(key) == 3 and isinstance(key[1], str):
            self._by_chain[(str(key[0]), key[1], _canonical(key[2]))] = result
        else:
            raise TypeError(
                f"fake chain key {key!r}: use a method name, (method, params) "
                "or (chain, method, params)"
            )

    def request(self, chain: str, method: str, params: list[Any]) -> Any:
        """The answer to ``method(*params)`` on ``chain`` (raises what the answer says)."""
        self.requests.append((chain, method, params))
        if self._answer is not None:
            result = self._answer(method, params)
        else:
            canonical = _canonical(params)
            missing = object()
            result = self._by_chain.get((chain, method, canonical), missing)
            if result is missing:
                result = self._by_params.get((method, canonical), missing)
            if result is missing:
                result = self._by_method.get(method, missing)
            if result is missing:
                raise UnansweredRequestError(
                    f"the fake chain has no answer for {method} on {chain!r} with params "
                    f"{params!r}: add ({method!r}, {tuple(params)!r}): <result> to chain="
                )
        if isinstance(result, BaseException):
            raise result
        return result
