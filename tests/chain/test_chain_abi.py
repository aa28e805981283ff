"""``blockx.chain``'s ABI helpers (``encode_call``, ``decode_result``, ``decode_log``) and
``blockx.chain_abi``: known vectors, the shapes of results, errors, revert reasons, and
that eth-abi is imported only on first use (an executor's start-up must not pay for it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from eth_abi import encode
from eth_hash.auto import keccak

from blockx.chain import (
    ChainStateError,
    ContractRevertError,
    decode_log,
    decode_result,
    encode_call,
)
from blockx.chain_abi import decode_revert, parse_signature, selector

HOLDER = "0x" + "ab" * 20
TRANSFER = "Transfer(address indexed from,address indexed to,uint256 value)"


def word(value: int) -> str:
    return format(value, "064x")


# --- encoding ----------------------------------------------------------------------------


def test_the_erc20_selectors_are_the_well_known_ones() -> None:
    assert selector("balanceOf(address)") == "0x70a08231"
    assert selector("transfer(address,uint256)") == "0xa9059cbb"
    assert selector("approve(address,uint)") == "0x095ea7b3"  # uint normalised to uint256
    assert selector("totalSupply()(uint256)") == "0x18160ddd"  # return types do not count


def test_encode_call_is_the_selector_and_the_abi_encoded_arguments() -> None:
    data = encode_call("balanceOf(address)(uint256)", [HOLDER])
    assert data == "0x70a08231" + "00" * 12 + "ab" * 20
    transfer = encode_call("transfer(address,uint256)", [HOLDER, 10**18])
    assert transfer == "0xa9059cbb" + "00" * 12 + "ab" * 20 + word(10**18)


def test_hex_strings_are_accepted_where_bytes_go_also_inside_arrays_and_tuples() -> None:
    data = encode_call(
        "f(bytes32,bytes,(bytes4,uint8)[])", ["0x" + "11" * 32, "0xdead", [("0x01020304", 7)]]
    )
    expected = encode(
        ["bytes32", "bytes", "(bytes4,uint8)[]"],
        [b"\x11" * 32, b"\xde\xad", [(b"\x01\x02\x03\x04", 7)]],
    )
    assert data == selector("f(bytes32,bytes,(bytes4,uint8)[])") + expected.hex()


def test_a_signature_with_returns_spelled_out_and_spaces() -> None:
    parsed = parse_signature("getReserves() returns (uint112, uint112, uint32)")
    assert parsed.name == "getReserves" and parsed.inputs == ()
    assert parsed.outputs == ("uint112", "uint112", "uint32")
    assert parse_signature("ping()").outputs is None


@pytest.mark.parametrize(
    ("signature", "args", "message"),
    [
        ("balanceOf(adress)", [HOLDER], "'adress' is not an ABI type"),
        ("balanceOf", [HOLDER], "expected name(types)"),
        ("balanceOf(address", [HOLDER], "unbalanced '('"),
        ("1f(uint256)", [1], "bad signature"),
        ("f(uint256)(uint256)(bool)", [1], "expected name(types) or name(types)(return types)"),
        ("f(uint8)", [300], "the arguments do not fit (uint8)"),
        ("f(uint256,bool)", [1], "expects 2 arguments (uint256, bool), got 1"),
        ("f(address)", ["0x1234"], "the arguments do not fit (address)"),
        ("f(bytes)", ["0xabc"], "must be 0x-prefixed hex bytes"),
        ("f(uint256)", 5, "the arguments must be a list"),
        (42, [], "a signature must be a str"),
    ],
)
def test_bad_signatures_and_arguments_raise_chain_state_error(
    signature: object, args: object, message: str
) -> None:
    with pytest.raises(ChainStateError) as caught:
        encode_call(signature, args)  # type: ignore[arg-type]
    assert message in str(caught.value)


# --- decoding ----------------------------------------------------------------------------


def test_decode_result_shapes() -> None:
    one = "0x" + word(5)
    two = "0x" + word(5) + word(1)
    assert decode_result("(uint256)", one) == 5  # one value in parentheses: unwrapped
    assert decode_result("uint256", one) == 5  # one type: that value
    assert decode_result(["uint256"], one) == (5,)  # a list of types: always a tuple
    assert decode_result("(uint112,bool)", two) == (5, True)
    assert decode_result("()", "0x") is None
    assert decode_result("(uint256)", bytes.fromhex(word(9))) == 9  # bytes work too


def test_decode_result_of_strings_addresses_bytes_and_tuples() -> None:
    data = encode(
        ["string", "address", "bytes", "(uint256,bool)[]"],
        ["héllo", HOLDER, b"\x00\x01", [(1, True), (2, False)]],
    )
    name, address, raw, pairs = decode_result("(string,address,bytes,(uint256,bool)[])", data)
    assert name == "héllo"
    assert address.lower() == HOLDER
    assert raw == b"\x00\x01"
    assert pairs == ((1, True), (2, False))


def test_data_that_does_not_decode_raises_chain_state_error() -> None:
    with pytest.raises(ChainStateError, match="do not decode as"):
        decode_result("(uint256)", "0x1234")
    with pytest.raises(ChainStateError, match="must be 0x-prefixed hex bytes"):
        decode_result("(uint256)", "nope")
    with pytest.raises(ChainStateError, match="bad types '\\(uint257\\)'"):
        decode_result("(uint257)", "0x" + word(1))
    with pytest.raises(ChainStateError, match="'adress' is not an ABI type"):
        decode_result(["adress"], "0x" + word(1))


# --- logs --------------------------------------------------------------------------------


def transfer_log(sender: str, to: str, value: int) -> dict[str, object]:
    return {
        "address": "0x" + "c0" * 20,
        "topics": [
            "0x" + keccak(b"Transfer(address,address,uint256)").hex(),
            "0x" + "00" * 12 + sender[2:],
            "0x" + "00" * 12 + to[2:],
        ],
        "data": "0x" + word(value),
        "blockNumber": "0x64",
    }


def test_decode_log_reads_indexed_topics_and_data_by_name() -> None:
    alice, bob = "0x" + "a1" * 20, "0x" + "b0" * 20
    event = decode_log(TRANSFER, transfer_log(alice, bob, 42))
    assert event["event"] == "Transfer"
    args = event["args"]
    assert args["from"].lower() == alice and args["to"].lower() == bob and args["value"] == 42


def test_decode_log_of_unnamed_and_dynamic_parameters() -> None:
    topic0 = "0x" + keccak(b"Note(string,uint256,string)").hex()
    hashed = "0x" + keccak(b"indexed text").hex()
    log = {
        "topics": [topic0, hashed],
        "data": "0x" + encode(["uint256", "string"], [7, "data text"]).hex(),
    }
    event = decode_log("Note(string indexed,uint256,string memo)", log)
    # an indexed string is only hashed in the log: its topic comes back as bytes
    assert event["args"] == {"arg0": bytes.fromhex(hashed[2:]), "arg1": 7, "memo": "data text"}


def test_decode_log_refuses_another_event_and_a_wrong_topic_count() -> None:
    log = transfer_log("0x" + "a1" * 20, "0x" + "b0" * 20, 1)
    with pytest.raises(ChainStateError, match="topic0"):
        decode_log("Approval(address indexed owner,address indexed spender,uint256 value)", log)
    with pytest.raises(ChainStateError, match="2 indexed parameters but 1 topics"):
        decode_log(TRANSFER, {**log, "topics": log["topics"][:2]})  # type: ignore[index]
    with pytest.raises(ChainStateError, match="bad event signature"):
        decode_log("Transfer", log)
    with pytest.raises(ChainStateError, match="log must be a log object"):
        decode_log(TRANSFER, "0x")  # type: ignore[arg-type]


# --- reverts -----------------------------------------------------------------------------


def test_revert_reasons() -> None:
    reason = "0x08c379a0" + encode(["string"], ["not enough: 7"]).hex()
    assert decode_revert(reason) == "not enough: 7"
    assert (
        decode_revert("0x4e487b71" + word(0x11)) == "panic 0x11 (arithmetic overflow or underflow)"
    )
    assert decode_revert("0x12345678") == "custom error 0x12345678"
    assert decode_revert("0x") == "no reason given"
    assert issubclass(ContractRevertError, ChainStateError)


# --- import cost -------------------------------------------------------------------------


def test_eth_abi_is_imported_on_first_use_only() -> None:
    # The executor imports blockx.chain (the prelude's ChainState) at start-up.
    code = (
        "import sys, blockx.executor.module_registry, blockx.chain\n"
        "print('eth_abi' in sys.modules, 'eth_utils' in sys.modules)\n"
        "blockx.chain.encode_call('f(uint256)', [1])\n"
        "print('eth_abi' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["False", "False", "True"]
