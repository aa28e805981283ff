"""Ethereum ABI for user code: encode a contract call, decode its answer and logs.

::

    data = encode_call("balanceOf(address)", [holder])          # "0x70a08231000..."
    (wei,) = decode_result(["uint256"], ChainState("eth").call(token, data))
    event = decode_log("Transfer(address indexed from,address indexed to,uint256 value)", log)

Exported as ``blockx.chain.encode_call``, ``decode_result``, ``decode_log``; used by
``ChainState.call_function``. This is SDK code (trusted): it imports eth-abi
itself, so it works for audited functions too, which cannot import eth-abi.

Theory of operation
-------------------
**Lazy.** eth-abi (with eth-utils, pydantic, ...) costs ~0.4 s of import; an
executor must not pay it at start-up. :func:`_abi` imports it on the first use
in a process and keeps it; everything else here is plain Python.

**Signatures.** ``name(inputs)`` optionally followed by ``(outputs)``:
``"balanceOf(address)(uint256)"``, ``"getReserves()(uint112,uint112,uint32)"``,
``"f((uint256,address)[],bool)"``. Types are eth-abi's grammar, normalised
(``uint`` → ``uint256``); the 4-byte selector is the keccak-256 of
``name(canonical inputs)``. A parsed signature is cached (by its text).

**Values.** Arguments are eth-abi's (``int``, ``bool``, ``str`` addresses,
``bytes``, lists, tuples), and a ``0x`` hex string is accepted where a
``bytes``/``bytesN`` value goes. Results are eth-abi's: ``int``, ``bool``,
checksummed address ``str``, ``bytes`` for ``bytes``/``bytesN`` (``.hex()``
them before returning them from a function), tuples for tuples and arrays.

**Shape of a result.** ``decode_result("(uint256)", ...)`` and
``call_function`` unwrap a single return value; several come as a tuple;
none as ``None``. A list of types (``["uint256"]``) always gives a tuple; a
single type without parentheses (``"uint256"``) gives that value.

**Reverts.** :func:`decode_revert` turns revert data into a reason:
``Error(string)`` → the string, ``Panic(uint256)`` → ``"panic 0x11"`` (with
its meaning), anything else → ``"custom error 0x1234abcd"``.

Errors: every misuse (a bad signature or type, arguments that do not fit,
data that does not decode) raises :class:`~blockx.chain.ChainStateError`
(a ``ValueError``: uncaught, ``user_error``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import ModuleType
from typing import Any, Final, NamedTuple

__all__ = [
    "AbiError",
    "Signature",
    "decode_log",
    "decode_result",
    "decode_revert",
    "encode_call",
    "parse_signature",
    "selector",
]

_NAME_RE: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_HEX_RE: Final = re.compile(r"(0x)?[0-9a-fA-F]*\Z")
#: ``Error(string)`` and ``Panic(uint256)``: the selectors of Solidity's own reverts.
ERROR_SELECTOR: Final = "08c379a0"
PANIC_SELECTOR: Final = "4e487b71"
_PANICS: Final[Mapping[int, str]] = {
    0x00: "generic compiler panic",
    0x01: "assert failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division or modulo by zero",
    0x21: "invalid enum value",
    0x22: "bad storage byte array",
    0x31: "pop on an empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to a zero-initialised function",
}

_modules: list[ModuleType] = []


class AbiError(ValueError):
    """Raised inside this module; ``blockx.chain`` re-raises it as ``ChainStateError``."""


def _abi() -> ModuleType:
    """eth-abi, imported on first use (see the module docstring)."""
    if not _modules:
        try:
            import eth_abi
        except ImportError as exc:  # pragma: no cover - a dependency of blockx
            raise AbiError(
                "the Ethereum ABI needs the eth-abi package (pip install 'eth-abi>=5.1,<7')"
            ) from exc
        _modules.append(eth_abi)
    return _modules[0]


def _keccak(data: bytes) -> bytes:
    from eth_hash.auto import keccak

    return bytes(keccak(data))


def _split_groups(text: str, what: str) -> list[str]:
    """``"(a,(b,c))(d)"`` → ``["(a,(b,c))", "(d)"]``: balanced parenthesised groups."""
    groups: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "(":
            if depth == 0:
                if index != start:
                    raise AbiError(f"{what}: unexpected {text[start:index]!r}")
                start = index
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise AbiError(f"{what}: unbalanced ')'")
            if depth == 0:
                end = index + 1
                # array suffixes belong to the group: "(uint256,bool)[]" stays one type
                while end < len(text) and text[end] == "[":
                    close = text.find("]", end)
                    if close < 0:
                        raise AbiError(f"{what}: unbalanced '['")
                    end = close + 1
                if end != index + 1:
                    raise AbiError(f"{what}: a parameter list cannot be an array")
                groups.append(text[start:end])
                start = end
    if depth:
        raise AbiError(f"{what}: unbalanced '('")
    if start != len(text):
        raise AbiError(f"{what}: unexpected {text[start:]!r}")
    return groups


def _types_of(group: str, what: str) -> tuple[str, ...]:
    """``"(uint,address)"`` → ``("uint256", "address")`` (normalised and checked)."""
    if group == "()":
        return ()
    abi = _abi()
    grammar = abi.grammar
    try:
        parsed = grammar.parse(grammar.normalize(group))
        parsed.validate()
    except Exception as exc:  # eth-abi's ParseError / ABITypeError
        raise AbiError(f"{what}: bad types {group!r}: {exc}") from None
    types = tuple(component.to_type_str() for component in parsed.components)
    for type_str in types:
        if not abi.is_encodable_type(type_str):
            raise AbiError(f"{what}: {type_str!r} is not an ABI type")
    return types


def _strip_names(text: str, *, indexed: bool = False) -> tuple[str, list[str], list[bool]]:
    """Drop parameter names (and ``indexed``) from one top-level parameter list:
    ``"address indexed from,uint256 value"`` → ``("address,uint256", ["from", "value"],
    [True, False])``. Nested tuples keep their components as written."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    if current.strip() or parts:
        parts.append(current)
    types: list[str] = []
    names: list[str] = []
    flags: list[bool] = []
    for part in parts:
        words = part.split()
        if not words:
            raise AbiError(f"an empty parameter in {text!r}")
        flag = False
        if indexed and len(words) > 1 and words[1] == "indexed":
            flag = True
            del words[1]
        if len(words) > 2 or (len(words) == 2 and not _NAME_RE.fullmatch(words[1])):
            raise AbiError(f"cannot read the parameter {part.strip()!r}")
        types.append(words[0])
        names.append(words[1] if len(words) == 2 else "")
        flags.append(flag)
    return ",".join(types), names, flags


class Signature(NamedTuple):
    """A parsed function signature: ``name``, its input and output types, its selector."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] | None
    selector: bytes

    @property
    def text(self) -> str:
        """The canonical ``name(types)`` the selector hashes."""
        return f"{self.name}({','.join(self.inputs)})"


@lru_cache(maxsize=1024)
def parse_signature(signature: str) -> Signature:
    """``"balanceOf(address)(uint256)"`` → its :class:`Signature`; raises :class:`AbiError`."""
    if type(signature) is not str:
        raise AbiError(f"a signature must be a str such as 'balanceOf(address)', got {signature!r}")
    text = re.sub(r"\)\s*returns\s*\(", ")(", signature.strip())
    text = "".join(text.split())
    match = _NAME_RE.match(text)
    if match is None:
        raise AbiError(f"bad signature {signature!r}: expected name(types)[(types)]")
    name = match.group()
    groups = _split_groups(text[match.end() :], f"bad signature {signature!r}")
    if not groups or len(groups) > 2:
        raise AbiError(
            f"bad signature {signature!r}: expected name(types) or name(types)(return types)"
        )
    inputs = _types_of(groups[0], f"signature {signature!r}")
    outputs = _types_of(groups[1], f"signature {signature!r}") if len(groups) == 2 else None
    digest = _keccak(f"{name}({','.join(inputs)})".encode())
    return Signature(name, inputs, outputs, digest[:4])


def selector(signature: str) -> str:
    """The 4-byte selector of ``signature`` as ``0x`` hex (``"0x70a08231"``)."""
    return "0x" + parse_signature(signature).selector.hex()


def _to_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if type(value) is str and _HEX_RE.match(value) and len(value) % 2 == 0:
        return bytes.fromhex(value[2:] if value.startswith("0x") else value)
    raise AbiError(f"{what} must be 0x-prefixed hex bytes (or bytes), got {value!r}")


def _coerce(type_str: str, value: Any) -> Any:
    """Hex strings where bytes go (recursively through arrays and tuples)."""
    grammar = _abi().grammar
    parsed = grammar.parse(type_str)
    return _coerce_parsed(parsed, value)


def _coerce_parsed(parsed: Any, value: Any) -> Any:
    if parsed.is_array:
        if isinstance(value, (list, tuple)):
            return [_coerce_parsed(parsed.item_type, v) for v in value]
        return value
    components = getattr(parsed, "components", None)
    if components is not None:
        if isinstance(value, (list, tuple)) and len(value) == len(components):
            return tuple(_coerce_parsed(c, v) for c, v in zip(components, value, strict=True))
        return value
    if getattr(parsed, "base", None) == "bytes" and type(value) is str:
        return _to_bytes(value, parsed.to_type_str())
    return value


def _encode(types: Sequence[str], args: Sequence[Any], what: str) -> bytes:
    if not isinstance(args, (list, tuple)):
        raise AbiError(f"{what}: the arguments must be a list, got {type(args).__name__}")
    if len(args) != len(types):
        raise AbiError(
            f"{what}: expects {len(types)} argument{'s' if len(types) != 1 else ''} "
            f"({', '.join(types)}), got {len(args)}"
        )
    abi = _abi()
    values = [_coerce(t, v) for t, v in zip(types, args, strict=True)]
    try:
        return bytes(abi.encode(list(types), values))
    except Exception as exc:  # eth-abi's EncodingError family, OverflowError, ...
        raise AbiError(f"{what}: the arguments do not fit ({', '.join(types)}): {exc}") from None


def encode_call(signature: str, args: Sequence[Any] = ()) -> str:
    """The ``eth_call`` data of ``signature`` with ``args``, as ``0x`` hex: the selector
    and the ABI-encoded arguments. Return types in the signature are ignored."""
    parsed = parse_signature(signature)
    encoded = _encode(parsed.inputs, args, parsed.text)
    return "0x" + parsed.selector.hex() + encoded.hex()


def _data_bytes(data: Any, what: str) -> bytes:
    return _to_bytes(data, what)


def _types_argument(types: Any) -> tuple[tuple[str, ...], str]:
    """``types`` → (the types, how to shape the result: ``tuple``, ``unwrap``, ``single``)."""
    if type(types) is str:
        text = "".join(types.split())
        if text.startswith("(") and _split_groups(text, f"bad types {types!r}") == [text]:
            return _types_of(text, "decode_result"), "unwrap"
        return _types_of(f"({text})", "decode_result"), "single"
    if isinstance(types, (list, tuple)) and all(type(t) is str for t in types):
        return _types_of("(" + ",".join(types) + ")", "decode_result"), "tuple"
    raise AbiError(f"types must be a type string or a list of them, got {types!r}")


def _decode(types: Sequence[str], data: bytes, what: str) -> tuple[Any, ...]:
    try:
        return tuple(_abi().decode(list(types), data))
    except Exception as exc:  # eth-abi's DecodingError family
        raise AbiError(
            f"{what}: {len(data)} bytes do not decode as ({', '.join(types)}): {exc}"
        ) from None


def shape(values: tuple[Any, ...], how: str) -> Any:
    """A result tuple shaped as :func:`decode_result` documents."""
    if how == "tuple":
        return values
    if how == "single" or len(values) == 1:
        return values[0]
    return values if values else None


def decode_result(types: str | Sequence[str], data: str | bytes) -> Any:
    """Decode ``eth_call`` return data: ``"(uint256)"`` → the value, ``"(uint112,uint112)"``
    → a tuple, ``["uint256"]`` → a 1-tuple, ``"uint256"`` → the value."""
    type_list, how = _types_argument(types)
    values = _decode(type_list, _data_bytes(data, "data"), "decode_result")
    return shape(values, how)


def decode_log(event_signature: str, log: Mapping[str, Any]) -> dict[str, Any]:
    """Decode one ``get_logs`` entry by its event, e.g.
    ``"Transfer(address indexed from,address indexed to,uint256 value)"``.

    Returns ``{"event": name, "args": {name: value, ...}}`` (unnamed parameters are
    ``"arg0"``, ``"arg1"``, ...). ``topics[0]`` must be the event's hash (anonymous
    events are not supported); indexed dynamic types (``string``, ``bytes``, arrays,
    tuples) are only hashed in a log: their value is the 32-byte topic as ``bytes``.
    """
    if type(event_signature) is not str:
        raise AbiError(f"an event signature must be a str, got {event_signature!r}")
    if not isinstance(log, Mapping):
        raise AbiError(f"log must be a log object (a dict from get_logs), got {log!r}")
    compact = event_signature.strip()
    match = _NAME_RE.match(compact)
    if match is None or not compact.endswith(")") or compact[match.end() : match.end() + 1] != "(":
        raise AbiError(
            f"bad event signature {event_signature!r}: expected Name(type [indexed] name, ...)"
        )
    name = match.group()
    inner = compact[match.end() + 1 : -1]
    type_text, names, flags = _strip_names(inner, indexed=True)
    types = _types_of(f"({type_text})", f"event {event_signature!r}")
    topic0 = "0x" + _keccak(f"{name}({','.join(types)})".encode()).hex()
    topics = log.get("topics")
    if not isinstance(topics, (list, tuple)) or not topics:
        raise AbiError(f"event {name}: the log has no topics")
    if str(topics[0]).lower() != topic0:
        raise AbiError(f"event {name}: the log's topic0 {topics[0]} is not {topic0}")
    indexed_types = [t for t, f in zip(types, flags, strict=True) if f]
    if len(topics) - 1 != len(indexed_types):
        raise AbiError(
            f"event {name}: {len(indexed_types)} indexed parameters but "
            f"{len(topics) - 1} topics after topic0"
        )
    data_types = [t for t, f in zip(types, flags, strict=True) if not f]
    data_values = iter(_decode(data_types, _data_bytes(log.get("data", "0x"), "log data"), name))
    topic_values = iter(topics[1:])
    args: dict[str, Any] = {}
    for index, (type_str, arg_name, flag) in enumerate(zip(types, names, flags, strict=True)):
        key = arg_name or f"arg{index}"
        if not flag:
            args[key] = next(data_values)
            continue
        topic = _data_bytes(next(topic_values), "topic")
        if _is_dynamic(type_str):
            args[key] = topic
        else:
            args[key] = _decode([type_str], topic, name)[0]
    return {"event": name, "args": args}


def _is_dynamic(type_str: str) -> bool:
    return type_str in ("string", "bytes") or type_str.endswith("]") or type_str.startswith("(")


def decode_revert(data: str | bytes) -> str:
    """A revert's reason from its data (see the module docstring)."""
    raw = _data_bytes(data, "revert data")
    if not raw:
        return "no reason given"
    head, body = raw[:4].hex(), raw[4:]
    if head == ERROR_SELECTOR:
        try:
            return str(_abi().decode(["string"], body)[0])
        except Exception:
            return f"Error(string) with undecodable data 0x{raw.hex()}"
    if head == PANIC_SELECTOR and len(body) == 32:
        code = int.from_bytes(body, "big")
        return f"panic 0x{code:02x} ({_PANICS.get(code, 'unknown panic code')})"
    return f"custom error 0x{head}" + (f" (data 0x{body.hex()})" if body else "")
