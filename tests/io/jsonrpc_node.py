"""A real Ethereum JSON-RPC HTTP server for the tests: aiohttp.web on 127.0.0.1, own thread.

:class:`FakeNode` serves a small deterministic chain (blocks 100..110, latest
110) and records every HTTP request it receives (``node.bodies``: the batch
size of each; 1 for a plain object). Knobs, set from the test thread:

* ``delay_s`` — every HTTP request is answered after this long;
* ``faults`` — a list consumed one per HTTP request: ``"500"``, ``"503"``,
  ``"429"``, ``"400"``, ``"drop"`` (close the connection, no answer),
  ``"hang"`` (answer after ``hang_s``), ``"bad_json"``, ``"drop_ids"`` (answer
  a batch without its odd ids), ``"batch_error"`` (one error object, id null),
  ``"429:<Retry-After>"`` (HTTP 429 with that ``Retry-After`` header),
  ``"limit_error"`` (every request answered JSON-RPC error -32005 "limit exceeded"),
  ``"limit_batch_error"`` (one error object, id null: code 429 "Too Many Requests");
  ``None`` entries mean "serve normally".

``node.arrivals`` records ``(time.monotonic(), requests in it)`` per HTTP request as it
arrives (before any delay or fault).

State model (so tests can compute what to expect):

* ``balance(addr, block) = int(addr[-4:], 16) * 10**18 + block``
* ``nonce(addr, block) = block - 100``
* ``code``: ``CONTRACT`` has ``CONTRACT_CODE``, every other address ``"0x"``
* ``storage(addr, slot, block) = slot + block`` as a 32-byte word
* ``eth_call`` to ``CONTRACT``: data ``0x70a08231 + address word`` returns the
  balance as a 32-byte word; data ``REVERT_DATA`` reverts (JSON-RPC error 3);
  ``getReserves()`` answers ``(RESERVES)`` as ``(uint112,uint112,uint32)``;
  ``name()`` answers ``"Fake Token"`` (``string``); ``withdraw(uint256 n)``
  reverts with ``Error("not enough: n")`` in the error's ``data`` (message
  ``execution reverted``, as Geth since 1.13 when the reason is in the data);
  ``divide(uint256)`` reverts with ``Panic(0x12)``.
* block n: ``{"number": hex(n), "hash": block_hash(n), "parentHash": ...,
  "transactions": [...]}``; each block has two logs, from ``CONTRACT`` and from
  ``OTHER``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web

CONTRACT = "0x" + "c0" * 20
OTHER = "0x" + "0e" * 20
ALICE = "0x" + "a1" * 18 + "0001"
BOB = "0x" + "b0" * 18 + "0002"
CONTRACT_CODE = "0x6080604052348015600f57600080fd5b50"
REVERT_DATA = "0xdeadbeef"
FIRST_BLOCK = 100
LATEST_BLOCK = 110
RESERVES = (1_000 * 10**18, 2_500_000 * 10**6, 1_700_000_123)
_SELECTORS = {
    "0902f1ac": "getReserves",  # getReserves()
    "06fdde03": "name",  # name()
    "2e1a7d4d": "withdraw",  # withdraw(uint256)
    "3e823f79": "divide",  # divide(uint256)
}


def abi_encode(types: list[str], values: list[Any]) -> str:
    from eth_abi import encode

    return "0x" + encode(types, values).hex()


def balance(address: str, block: int) -> int:
    return int(address[-4:], 16) * 10**18 + block


def word(value: int) -> str:
    return "0x" + format(value, "064x")


def block_hash(number: int) -> str:
    return "0x" + format(number, "064x").replace("0", "b", 8)


class RpcFault(Exception):
    def __init__(self, code: int, message: str, data: str | None = None) -> None:
        self.code = code
        self.message = message
        self.data = data


class FakeNode:
    """See the module docstring."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.hang_s = 5.0
        self.faults: list[str | None] = []
        self.bodies: list[int] = []
        self.methods: list[str] = []
        self.arrivals: list[tuple[float, int]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeNode:
        self._thread = threading.Thread(target=self._serve, name="fake-node", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake JSON-RPC node did not start")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/", self._handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def reset(self) -> None:
        with self._lock:
            self.delay_s = 0.0
            self.hang_s = 5.0
            self.faults = []
            self.bodies = []
            self.methods = []
            self.arrivals = []

    def __enter__(self) -> FakeNode:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # --- HTTP --------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        arrived = time.monotonic()
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
            delay = self.delay_s
        body = json.loads(raw)
        batch = isinstance(body, list)
        items = body if batch else [body]
        with self._lock:
            self.bodies.append(len(items) if batch else 1)
            self.arrivals.append((arrived, len(items)))
            self.methods.extend(str(i.get("method")) for i in items)
        if delay:
            await asyncio.sleep(delay)
        if fault in ("500", "503", "429", "400"):
            return web.Response(status=int(fault), text=f"injected {fault}")
        if fault is not None and fault.startswith("429:"):
            return web.Response(
                status=429, text="slow down", headers={"Retry-After": fault[len("429:") :]}
            )
        if fault == "limit_batch_error":
            return web.json_response(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": 429, "message": "Too Many Requests"},
                }
            )
        if fault == "limit_error":
            limited = [
                {
                    "jsonrpc": "2.0",
                    "id": item.get("id"),
                    "error": {"code": -32005, "message": "daily request count limit exceeded"},
                }
                for item in items
            ]
            return web.json_response(limited if batch else limited[0])
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if fault == "hang":
            await asyncio.sleep(self.hang_s)
        if fault == "bad_json":
            return web.Response(
                status=200, text="<html>oops</html>", content_type="application/json"
            )
        if fault == "batch_error":
            return web.json_response(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "batch too large"},
                }
            )
        answers = [self._answer(item) for item in items]
        if fault == "drop_ids":
            answers = [a for a in answers if not (isinstance(a.get("id"), int) and a["id"] % 2)]
        answers.reverse()  # clients must match by id, not by position
        return web.json_response(answers if batch else answers[0])

    def _answer(self, item: dict[str, Any]) -> dict[str, Any]:
        rid = item.get("id")
        try:
            result = self._dispatch(item.get("method"), item.get("params") or [])
        except RpcFault as fault:
            error: dict[str, Any] = {"code": fault.code, "message": fault.message}
            if fault.data is not None:
                error["data"] = fault.data
            return {"jsonrpc": "2.0", "id": rid, "error": error}
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    # --- the chain ---------------------------------------------------------------------------

    @staticmethod
    def _block(ref: Any) -> int:
        if isinstance(ref, dict):
            ref = ref.get("blockHash")
            for n in range(FIRST_BLOCK, LATEST_BLOCK + 1):
                if block_hash(n) == ref:
                    return n
            raise RpcFault(-32001, "block not found")
        if ref in ("latest", "safe", "finalized", "pending", None):
            return LATEST_BLOCK
        if ref == "earliest":
            return FIRST_BLOCK
        if isinstance(ref, str) and ref.startswith("0x"):
            n = int(ref, 16)
            if n > LATEST_BLOCK:
                raise RpcFault(-32001, f"header not found for block {n}")
            return n
        raise RpcFault(-32602, f"invalid block reference {ref!r}")

    def _dispatch(self, method: Any, params: list[Any]) -> Any:
        if method == "eth_blockNumber":
            return hex(LATEST_BLOCK)
        if method == "eth_chainId":
            return "0x1"
        if method == "eth_getBalance":
            return hex(balance(params[0], self._block(params[1])))
        if method == "eth_getTransactionCount":
            return hex(self._block(params[1]) - FIRST_BLOCK)
        if method == "eth_getCode":
            self._block(params[1])
            return CONTRACT_CODE if params[0].lower() == CONTRACT else "0x"
        if method == "eth_getStorageAt":
            return word(int(params[1], 16) + self._block(params[2]))
        if method == "eth_call":
            tx, ref = params
            self._block(ref)
            data = tx.get("data") or tx.get("input") or "0x"
            if tx.get("to", "").lower() != CONTRACT:
                return "0x"
            if data == REVERT_DATA:
                raise RpcFault(3, "execution reverted")
            if data.startswith("0x70a08231") and len(data) == 10 + 64:
                holder = "0x" + data[-40:]
                return word(balance(holder, self._block(ref)))
            function = _SELECTORS.get(data[2:10])
            if function == "getReserves":
                return abi_encode(["uint112", "uint112", "uint32"], list(RESERVES))
            if function == "name":
                return abi_encode(["string"], ["Fake Token"])
            if function == "withdraw":
                amount = int(data[10:74], 16)
                reason = abi_encode(["string"], [f"not enough: {amount}"])
                raise RpcFault(3, "execution reverted", "0x08c379a0" + reason[2:])
            if function == "divide":
                raise RpcFault(3, "execution reverted", "0x4e487b71" + word(0x12)[2:])
            raise RpcFault(-32000, "unknown selector")
        if method in ("eth_getBlockByNumber", "eth_getBlockByHash"):
            ref = params[0]
            if method == "eth_getBlockByHash":
                ref = {"blockHash": ref}
            try:
                n = self._block(ref)
            except RpcFault:
                return None
            txs = [f"0x{n:062x}{i:02x}" for i in range(2)]
            if params[1]:
                txs = [{"hash": h, "blockNumber": hex(n), "from": ALICE, "to": BOB} for h in txs]
            return {
                "number": hex(n),
                "hash": block_hash(n),
                "parentHash": block_hash(n - 1),
                "timestamp": hex(1_700_000_000 + 12 * n),
                "transactions": txs,
            }
        if method == "eth_getLogs":
            query = params[0]
            if "blockHash" in query:
                lo = hi = self._block({"blockHash": query["blockHash"]})
            else:
                lo = self._block(query.get("fromBlock", "latest"))
                hi = self._block(query.get("toBlock", "latest"))
            wanted = query.get("address")
            if isinstance(wanted, str):
                wanted = [wanted]
            logs = []
            for n in range(lo, hi + 1):
                for i, address in enumerate((CONTRACT, OTHER)):
                    if wanted and address not in [w.lower() for w in wanted]:
                        continue
                    logs.append(
                        {
                            "address": address,
                            "blockNumber": hex(n),
                            "logIndex": hex(i),
                            "topics": [word(n)],
                            "data": word(i),
                        }
                    )
            return logs
        raise RpcFault(-32601, f"the method {method} does not exist/is not available")
