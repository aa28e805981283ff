"""``blockx.chain``: read a chain's state at a block, from user code.

::

    def _(p):
        state = ChainState("eth", 19_000_000)        # or a tag: "latest", "finalized", ...
        wei = state.get_address_balance(p["addr"])   # int
        code = state.get_address_code(p["token"])    # "0x6080..."
        out = state.call(p["token"], "0x70a08231" + p["addr"][2:].rjust(64, "0"))
        return {"wei": wei, "balance_of": int(out, 16)}

Contract calls with the ABI done for you (``blockx.chain_abi``; eth-abi, imported on
first use)::

    state = ChainState("eth", 19_000_000)
    wei = state.call_function(token, "balanceOf(address)(uint256)", [holder])      # int
    r0, r1, ts = state.call_function(pair, "getReserves()(uint112,uint112,uint32)")
    data = encode_call("transfer(address,uint256)", [to, 5])                       # "0xa9059cbb..."
    event = decode_log("Transfer(address indexed from,address indexed to,uint256 value)", log)

``ChainState`` is predefined in every function module (no import needed). Each
method is one Ethereum JSON-RPC request through the worker's ``rpc`` backend
to the endpoints configured for the chain (``io.rpc.endpoints``); the worker
batches concurrent requests, retries transient failures, caches answers per
task (reads at ``pending`` excepted) and shares one request among identical
concurrent reads.

Quantities are converted to ``int`` where the method's name says so
(``get_address_balance``, ``get_address_nonce``, ``get_block_number``);
data (``get_address_code``, ``get_storage_at``, ``call``) stays a ``0x`` hex
string; blocks and logs are returned as the node sends them (dicts of hex
strings).

Errors: a bad address, slot, block or argument raises :class:`ChainStateError`
here, before any request (uncaught: ``user_error``, not retried); so do a bad
ABI signature, arguments that do not fit it and answers that do not decode.
A contract that reverts under ``call_function`` raises
:class:`ContractRevertError` (a ``ChainStateError``) whose message and ``reason``
carry the decoded reason (``Error(string)``'s text, a ``Panic`` code, or a
custom error's selector) and ``data`` the raw revert data. A JSON-RPC
error (a revert, an unknown block) or a node that cannot be reached raises
``RemoteIOError`` (kind ``io_error``; retryable only for transient failures).
Outside a call run by the BlockX executor, every method raises
``blockx.sdk.NoProviderError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from blockx.sdk.rpc import BACKEND as _RPC_BACKEND
from blockx.sdk.runtime import _provider as _provider_var
from blockx.sdk.runtime import get_provider as _get_provider

__all__ = [
    "BLOCK_TAGS",
    "ChainState",
    "ChainStateError",
    "ContractRevertError",
    "decode_log",
    "decode_result",
    "encode_call",
    "hex_quantity",
]

#: Block tags a ChainState accepts besides a number or a block hash.
BLOCK_TAGS: Final = frozenset({"latest", "earliest", "pending", "safe", "finalized"})
_ADDRESS_RE: Final = re.compile(r"0x[0-9a-fA-F]{40}\Z")
_HEX_RE: Final = re.compile(r"0x[0-9a-fA-F]*\Z")
_QUANTITY_RE: Final = re.compile(r"0x[0-9a-fA-F]+\Z")
_HASH_RE: Final = re.compile(r"0x[0-9a-fA-F]{64}\Z")
_CHAIN_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_SORTED: Final = orjson.OPT_SORT_KEYS
#: Where the worker's rpc error message carries a revert's data (``worker/io/rpc.py``).
_REVERT_DATA_RE: Final = re.compile(r"\(data: (0x[0-9a-fA-F]*)\)")


class ChainStateError(ValueError):
    """A ChainState was used wrongly (bad chain, block, address, slot or argument);
    nothing was sent."""


class ContractRevertError(ChainStateError):
    """The contract reverted (``call_function``). ``reason``: the decoded reason;
    ``data``: the revert data as ``0x`` hex (``"0x"`` when the node sent none)."""

    reason: str
    data: str


def encode_call(signature: str, args: Sequence[Any] = ()) -> str:
    """``eth_call`` data for ``signature`` (``"transfer(address,uint256)"``) and ``args``:
    the 4-byte selector and the ABI-encoded arguments, as ``0x`` hex."""
    from blockx import chain_abi as _abi

    try:
        return _abi.encode_call(signature, args)
    except _abi.AbiError as exc:
        raise ChainStateError(str(exc)) from None


def decode_result(types: str | Sequence[str], data: str | bytes) -> Any:
    """Decode return data: ``"(uint256)"`` → the value, ``"(uint112,uint112)"`` → a tuple,
    ``["uint256"]`` → a 1-tuple, ``"uint256"`` → the value (``blockx.chain_abi``)."""
    from blockx import chain_abi as _abi

    try:
        return _abi.decode_result(types, data)
    except _abi.AbiError as exc:
        raise ChainStateError(str(exc)) from None


def decode_log(event_signature: str, log: Mapping[str, Any]) -> dict[str, Any]:
    """Decode a ``get_logs`` entry: ``{"event": name, "args": {name: value}}``, for
    ``"Transfer(address indexed from,address indexed to,uint256 value)"``."""
    from blockx import chain_abi as _abi

    try:
        return _abi.decode_log(event_signature, log)
    except _abi.AbiError as exc:
        raise ChainStateError(str(exc)) from None


def _revert_error(where: str, exc: BaseException) -> ContractRevertError | None:
    """The revert an ``eth_call`` failure reports, or None if it is another failure."""
    from blockx import chain_abi as _abi

    message = str(exc)
    if getattr(exc, "kind", None) != "io_error" or "revert" not in message.lower():
        return None
    found = _REVERT_DATA_RE.search(message)
    data = found.group(1) if found else "0x"
    try:
        reason = _abi.decode_revert(data)
    except _abi.AbiError:
        reason = f"undecodable revert data {data}"
    if not found:
        # the node said why in its message ("execution reverted: ..."), or nothing
        said = message.lower().rpartition("execution reverted")[2].strip(" :")
        reason = message[len(message) - len(said) :] if said else "no reason given"
    error = ContractRevertError(f"{where} reverted: {reason}")
    error.reason = reason
    error.data = data
    return error


#: The account reads' pure results, kept per process (cleared whole at this size): a
#: request's cache key by ``(chain, address, block)`` -- the address checked once -- and an
#: answer's int by its text. A task reads a few accounts at one block again and again, and
#: the executor answers a repeated read from its own cache (``executor/local_reads.py``)
#: with the very same string: the read then costs a dict lookup where the address regex,
#: the key's JSON and the answer's regex and parse cost ~7k instructions.
_READ_MEMO_MAX: Final = 4096
_read_keys: dict[tuple[str, str, str], str] = {}
_quantities: dict[str, int] = {}


def hex_quantity(value: Any) -> int:
    """``int`` of a JSON-RPC quantity (``"0x1bc16d674ec80000"``); raises ValueError."""
    if type(value) is int:
        return value
    if type(value) is not str or not _QUANTITY_RE.match(value):
        raise ValueError(f"not a hex quantity: {value!r}")
    return int(value, 16)


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


class ChainState:
    """The state of ``chain`` at ``block`` (see the module docstring).

    ``block`` is a number (``19_000_000``), a tag (``"latest"``, ``"earliest"``,
    ``"pending"``, ``"safe"``, ``"finalized"``), a hex number (``"0x121eac0"``),
    or a block hash (``"0x" + 64 hex``: EIP-1898, for the state methods).
    """

    __slots__ = ("_block_param", "block", "chain")

    def __init__(self, chain: str, block: int | str = "latest") -> None:
        if type(chain) is not str or not _CHAIN_RE.match(chain):
            raise ChainStateError(
                f"chain must be a chain name such as 'eth' (as configured in io.rpc.endpoints), "
                f"got {chain!r}"
            )
        self.chain = chain
        self.block = block
        self._block_param = self._block_ref(block)

    def __repr__(self) -> str:
        return f"ChainState({self.chain!r}, {self.block!r})"

    # --- checks ---------------------------------------------------------------------------------

    def _error(self, message: str) -> ChainStateError:
        return ChainStateError(f"ChainState({self.chain!r}): {message}")

    def _block_ref(self, block: Any) -> Any:
        if type(block) is int:
            if block < 0:
                raise self._error(f"block number must not be negative, got {block}")
            return hex(block)
        if type(block) is str:
            if block in BLOCK_TAGS:
                return block
            if _HASH_RE.match(block):
                return {"blockHash": block}
            if _QUANTITY_RE.match(block):
                return hex(int(block, 16))
        raise self._error(
            f"block must be a number, a tag ({', '.join(sorted(BLOCK_TAGS))}), a hex number "
            f"or a block hash, got {block!r}"
        )

    def _address(self, value: Any, what: str = "address") -> str:
        if type(value) is not str or not _ADDRESS_RE.match(value):
            raise self._error(f"{what} must be a 0x-prefixed 20-byte hex address, got {value!r}")
        return value

    def _hex_data(self, value: Any, what: str) -> str:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return "0x" + bytes(value).hex()
        if type(value) is not str or not _HEX_RE.match(value) or len(value) % 2:
            raise self._error(f"{what} must be 0x-prefixed hex bytes (or bytes), got {value!r}")
        return value

    def _quantity(self, value: Any, what: str) -> str:
        if type(value) is int and value >= 0:
            return hex(value)
        if type(value) is str and _QUANTITY_RE.match(value):
            return hex(int(value, 16))
        raise self._error(f"{what} must be a non-negative int or a hex quantity, got {value!r}")

    # --- requests -------------------------------------------------------------------------------

    def request(self, method: str, params: Sequence[Any] = ()) -> Any:
        """Any JSON-RPC read: ``method(*params)`` on this chain; returns the raw result."""
        if type(method) is not str or not method:
            raise self._error(f"method must be a JSON-RPC method name, got {method!r}")
        body = {"chain": self.chain, "params": list(params)}
        try:
            cache_key: str | None = orjson.dumps(body, option=_SORTED).decode()
        except TypeError:
            cache_key = None  # uint256 params: the worker builds the key itself
        # blockx.sdk.rpc.call(chain, method, params), without its second dict and copy
        return _get_provider().read_req(_RPC_BACKEND, method, body, cache_key=cache_key)

    def _account_quantity(self, method: str, address: Any) -> int:
        """``method(address, block)`` as an int: :meth:`get_address_balance` and
        :meth:`get_address_nonce`, the reads a task makes most, often of the same few
        accounts at one block (see :data:`_READ_MEMO_MAX`)."""
        chain = self.chain
        block = self._block_param
        memo = None
        if type(address) is str and type(block) is str and type(chain) is str:
            memo = (chain, address, block)
            cache_key = _read_keys.get(memo)
        else:
            cache_key = None
        params = [address, block]
        if cache_key is None:
            if type(address) is not str or _ADDRESS_RE.match(address) is None:
                self._address(address)  # raises
            cache_key = orjson.dumps({"chain": chain, "params": params}, option=_SORTED).decode()
            if memo is not None:
                if len(_read_keys) >= _READ_MEMO_MAX:
                    _read_keys.clear()
                _read_keys[memo] = cache_key
        # get_provider() written out (it raises when there is none): a frame fewer a read.
        provider = _provider_var.get()
        if provider is None:
            provider = _get_provider()
        result = provider.read_req(
            _RPC_BACKEND, method, {"chain": chain, "params": params}, cache_key=cache_key
        )
        if type(result) is str:
            value = _quantities.get(result)
            if value is not None:
                return value
            if _QUANTITY_RE.match(result):  # hex_quantity, written out
                value = int(result, 16)
                if len(_quantities) >= _READ_MEMO_MAX:
                    _quantities.clear()
                _quantities[result] = value
                return value
        elif type(result) is int:
            return result
        raise self._error(f"{method} answered {result!r}, not a hex quantity")

    def get_address_balance(self, address: str) -> int:
        """The balance of ``address`` in wei (``eth_getBalance``)."""
        return self._account_quantity("eth_getBalance", address)

    def get_address_nonce(self, address: str) -> int:
        """The transaction count of ``address`` (``eth_getTransactionCount``)."""
        return self._account_quantity("eth_getTransactionCount", address)

    def _quantity_result(self, method: str, params: list[Any]) -> int:
        result = self.request(method, params)
        try:
            return hex_quantity(result)
        except ValueError:
            raise self._error(f"{method} answered {result!r}, not a hex quantity") from None

    def get_address_code(self, address: str) -> str:
        """The contract code at ``address`` as ``0x`` hex (``"0x"``: none; ``eth_getCode``)."""
        return self.request("eth_getCode", [self._address(address), self._block_param])  # type: ignore[no-any-return]

    def get_storage_at(self, address: str, slot: int | str) -> str:
        """The 32-byte storage word at ``slot`` as ``0x`` hex (``eth_getStorageAt``)."""
        return self.request(  # type: ignore[no-any-return]
            "eth_getStorageAt",
            [self._address(address), self._quantity(slot, "slot"), self._block_param],
        )

    def call(
        self,
        to: str,
        data: str | bytes,
        *,
        from_address: str | None = None,
        value: int | None = None,
        gas: int | None = None,
    ) -> str:
        """``eth_call``: run ``data`` against ``to`` at this block; the return data as ``0x`` hex.

        A revert raises ``RemoteIOError`` with the node's message (not retryable).
        """
        tx: dict[str, Any] = {"to": self._address(to, "to"), "data": self._hex_data(data, "data")}
        if from_address is not None:
            tx["from"] = self._address(from_address, "from_address")
        if value is not None:
            tx["value"] = self._quantity(value, "value")
        if gas is not None:
            tx["gas"] = self._quantity(gas, "gas")
        return self.request("eth_call", [tx, self._block_param])  # type: ignore[no-any-return]

    def call_function(
        self,
        to: str,
        signature: str,
        args: Sequence[Any] = (),
        *,
        from_address: str | None = None,
        value: int | None = None,
        gas: int | None = None,
    ) -> Any:
        """Call a contract's function by its signature and decode the answer.

        ``signature`` is ``"name(input types)(return types)"``
        (``"balanceOf(address)(uint256)"``); ``args`` the inputs (hex strings accepted
        for ``bytes``). Returns the decoded value: one return value unwrapped, several
        as a tuple, none (or no return types given) as ``None``.
        A bad signature or arguments raise :class:`ChainStateError` before any request;
        a revert raises :class:`ContractRevertError` with the decoded reason.
        """
        from blockx import chain_abi as _abi

        try:
            parsed = _abi.parse_signature(signature)
            data = _abi.encode_call(signature, args)
        except _abi.AbiError as exc:
            raise self._error(str(exc)) from None
        where = f"{parsed.text} at {to}"
        try:
            out = self.call(to, data, from_address=from_address, value=value, gas=gas)
        except ChainStateError:
            raise
        except Exception as exc:
            revert = _revert_error(f"ChainState({self.chain!r}): {where}", exc)
            if revert is None:
                raise
            raise revert from None
        if parsed.outputs is None:
            return None
        if type(out) is not str:
            raise self._error(f"{where}: eth_call answered {out!r}, not hex data")
        if parsed.outputs and out in ("0x", ""):
            raise self._error(
                f"{where}: the call returned no data (no contract at {to}, or no such function)"
            )
        try:
            values = _abi.decode_result("(" + ",".join(parsed.outputs) + ")", out)
        except _abi.AbiError as exc:
            raise self._error(f"{where}: {exc}") from None
        return values

    def get_block(self, full_txs: bool = False) -> dict[str, Any] | None:
        """The block (``eth_getBlockByNumber``; by hash when the block is a hash), or None.

        ``full_txs``: transactions as objects instead of hashes.
        """
        if type(full_txs) is not bool:
            raise self._error(f"full_txs must be True or False, got {full_txs!r}")
        ref = self._block_param
        if type(ref) is dict:
            return self.request("eth_getBlockByHash", [ref["blockHash"], full_txs])  # type: ignore[no-any-return]
        return self.request("eth_getBlockByNumber", [ref, full_txs])  # type: ignore[no-any-return]

    def get_block_number(self) -> int:
        """This block's number: the number given, else the node's (``latest``:
        ``eth_blockNumber``, never cached; other tags and hashes: the block's ``number``)."""
        if type(self.block) is int:
            return self.block
        if self.block == "latest":
            return self._quantity_result("eth_blockNumber", [])
        block = self.get_block()
        if block is None:
            raise self._error(f"block {self.block!r} was not found")
        return hex_quantity(block.get("number"))

    def get_logs(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """``eth_getLogs``: the logs matching ``filter`` (``address``, ``topics``,
        ``fromBlock``, ``toBlock`` or ``blockHash``). Without a block range the
        range is this block alone; int block numbers are converted to hex."""
        query: dict[str, Any] = {}
        for name, value in (filter or {}).items():
            if name in ("fromBlock", "toBlock"):
                if type(value) is int:
                    value = self._quantity(value, name)
                elif type(value) is not str:
                    raise self._error(f"{name} must be a block number or tag, got {value!r}")
            elif name == "address":
                if isinstance(value, (list, tuple)):
                    value = [self._address(a, "address") for a in value]
                else:
                    value = self._address(value, "address")
            elif name == "topics":
                if not isinstance(value, (list, tuple)):
                    raise self._error(f"topics must be a list, got {_type_name(value)}")
                value = [list(t) if isinstance(t, tuple) else t for t in value]
            elif name != "blockHash":
                raise self._error(
                    f"unknown log filter field {name!r} "
                    "(address, topics, fromBlock, toBlock, blockHash)"
                )
            query[name] = value
        if not ({"fromBlock", "toBlock", "blockHash"} & query.keys()):
            ref = self._block_param
            if type(ref) is dict:
                query["blockHash"] = ref["blockHash"]
            else:
                query["fromBlock"] = ref
                query["toBlock"] = ref
        return self.request("eth_getLogs", [query])  # type: ignore[no-any-return]
