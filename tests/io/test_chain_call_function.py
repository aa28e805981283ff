"""``ChainState.call_function``: a contract function called by its signature, its answer
decoded, its revert's reason decoded — against the real local JSON-RPC node
(``jsonrpc_node.FakeNode``), first through the SDK's provider seam (a real IO
subsystem on a background loop), then end to end on real executors, in an
audited task (``audit=True``: user code cannot import eth-abi, the SDK can)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from jsonrpc_node import ALICE, BOB, CONTRACT, RESERVES, FakeNode, balance
from test_sdk_table_chain import LoopProvider, installed

from blockx.chain import ChainState, ChainStateError, ContractRevertError, encode_call
from blockx.executor.sdk_bridge import RemoteIOError
from blockx.worker.io.config import load_io_config
from blockx.worker.io.registry import IOSubsystem

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker", "e2e"))
from e2e_support import WorkerSession, e2e_config

from blockx.worker.api import Call, Task, TaskPolicy


@pytest.fixture
def live(tmp_path: Any, node: FakeNode) -> Iterator[LoopProvider]:
    config = load_io_config({"rpc": {"endpoints": {"eth": [node.url]}}}, env={})
    provider = LoopProvider(config)
    try:
        yield from installed(provider)  # type: ignore[misc]
    finally:
        provider.close()


# --- through the provider seam ---------------------------------------------------------------


def test_call_function_decodes_one_value_several_and_strings(live: LoopProvider) -> None:
    state = ChainState("eth", 105)
    assert state.call_function(CONTRACT, "balanceOf(address)(uint256)", [ALICE]) == balance(
        ALICE, 105
    )
    assert state.call_function(CONTRACT, "getReserves()(uint112,uint112,uint32)") == RESERVES
    assert state.call_function(CONTRACT, "name()(string)") == "Fake Token"
    assert state.call_function(CONTRACT, "getReserves()") is None  # no return types given
    sent = [r[3]["params"][0]["data"] for r in live.requests]
    assert sent[0] == encode_call("balanceOf(address)", [ALICE])


def test_a_revert_with_a_reason_string_is_decoded_into_the_error(live: LoopProvider) -> None:
    state = ChainState("eth", "latest")
    with pytest.raises(ContractRevertError) as caught:
        state.call_function(CONTRACT, "withdraw(uint256)(bool)", [7])
    error = caught.value
    assert isinstance(error, ChainStateError)
    assert error.reason == "not enough: 7"
    assert error.data.startswith("0x08c379a0")
    assert str(error) == (
        f"ChainState('eth'): withdraw(uint256) at {CONTRACT} reverted: not enough: 7"
    )
    with pytest.raises(ContractRevertError, match=r"panic 0x12 \(division or modulo by zero\)"):
        state.call_function(CONTRACT, "divide(uint256)(uint256)", [0])


def test_the_worker_adds_the_reason_to_a_plain_calls_error(live: LoopProvider) -> None:
    # ChainState.call keeps its contract (RemoteIOError); the message now says why.
    with pytest.raises(RemoteIOError) as caught:
        ChainState("eth", 105).call(CONTRACT, encode_call("withdraw(uint256)", [3]))
    message = str(caught.value)
    assert "JSON-RPC error 3: execution reverted: not enough: 3 (data: 0x08c379a0" in message


def test_misuse_raises_chain_state_error_before_any_request(live: LoopProvider) -> None:
    state = ChainState("eth", 105)
    with pytest.raises(ChainStateError, match="'adress' is not an ABI type"):
        state.call_function(CONTRACT, "balanceOf(adress)(uint256)", [ALICE])
    with pytest.raises(ChainStateError, match=r"expects 1 argument \(address\), got 0"):
        state.call_function(CONTRACT, "balanceOf(address)(uint256)")
    with pytest.raises(ChainStateError, match="to must be a 0x-prefixed 20-byte hex address"):
        state.call_function("0x12", "balanceOf(address)(uint256)", [ALICE])
    assert live.requests == []
    with pytest.raises(ChainStateError, match="the call returned no data"):
        state.call_function(BOB, "balanceOf(address)(uint256)", [ALICE])  # no contract there


# --- end to end, audited ---------------------------------------------------------------------

AUDITED = """
from blockx.chain import ChainStateError, decode_result, encode_call


def _(p):
    state = ChainState("eth", p["block"])
    wei = state.call_function(p["token"], "balanceOf(address)(uint256)", [p["holder"]])
    r0, r1, ts = state.call_function(p["token"], "getReserves()(uint112,uint112,uint32)")
    raw = state.call(p["token"], encode_call("balanceOf(address)", [p["holder"]]))
    try:
        state.call_function(p["token"], "withdraw(uint256)", [p["n"]])
        reason = None
    except ChainStateError as e:
        reason = str(e)
    return {
        "wei": wei,
        "reserves": [r0, r1, ts],
        "raw": decode_result("(uint256)", raw),
        "reason": reason,
    }
"""

UNCAUGHT_REVERT = """
def _(p):
    return ChainState("eth", "latest").call_function(p["token"], "withdraw(uint256)", [p["n"]])
"""

IMPORTS_ETH_ABI = (
    "import eth_abi\n\n\ndef _(p):\n    return eth_abi.encode(['uint256'], [1]).hex()\n"
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_call_function_in_an_audited_task_on_real_executors(tmp_path: Any, node: FakeNode) -> None:
    io = IOSubsystem(load_io_config({"rpc": {"endpoints": {"eth": [node.url]}}}, env={}))
    with WorkerSession(e2e_config()) as session:

        async def scenario() -> Any:
            try:
                task = Task(
                    functions={
                        "audited": AUDITED,
                        "uncaught": UNCAUGHT_REVERT,
                        "imports": IMPORTS_ETH_ABI,
                    },
                    calls=[
                        *(
                            Call(
                                "audited",
                                {"block": 100 + i, "token": CONTRACT, "holder": ALICE, "n": i},
                            )
                            for i in range(4)
                        ),
                        Call("uncaught", {"token": CONTRACT, "n": 9}),
                        Call("imports", {}),
                    ],
                    audit=True,
                    policy=TaskPolicy(failure="continue", max_attempts=2),
                )
                task.io_handler = io.task_scope(task.task_id)
                return await session.worker.run_task(task)
            finally:
                await io.close()

        result = session.run(scenario(), timeout=150)
    outputs = [o for o in result.outputs if o is not None]
    assert outputs == [
        {
            "wei": balance(ALICE, 100 + i),  # beyond 64 bits: exact through the wire
            "reserves": list(RESERVES),
            "raw": balance(ALICE, 100 + i),
            "reason": f"ChainState('eth'): withdraw(uint256) at {CONTRACT} reverted: "
            f"not enough: {i}",
        }
        for i in range(4)
    ]
    errors = {e.function_id: e for e in result.errors}
    uncaught = errors["uncaught"]
    assert uncaught.kind == "user_error" and not uncaught.retryable and uncaught.attempts == 1
    assert "ContractRevertError" in uncaught.message and "not enough: 9" in uncaught.message
    assert errors["imports"].kind == "audit_rejected"
