"""BackendAnswer: a backend's answer future reaches its flight without an event-loop turn.

The scope's flight takes a :class:`BackendAnswer` with ``deliver_to``: the backend's
``set_result`` runs the flight's answer (and so the worker's ``deliver_to`` callback) at
once; a flight abandoned by every waiter forgets that callback before cancelling the
backend's future, so nothing is answered twice; the backend's own ``on_cancel`` hook
runs inside ``cancel()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from io_support import ok, payload, run
from test_io_scope import GateBackend, subsystem

from blockx.worker.io.backend import PreparedRequest, Reply
from blockx.worker.io.read_answer import BackendAnswer


class DirectGate(GateBackend):
    """GateBackend whose futures are BackendAnswers (as the rpc backend's are)."""

    def execute(self, request: PreparedRequest) -> asyncio.Future[Reply]:
        self.calls += 1
        future = BackendAnswer(loop=asyncio.get_running_loop())
        self.open.append((request.operation, request.body, future))
        return future


def test_a_backend_answer_reaches_the_worker_inside_set_result() -> None:
    gate = DirectGate()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        p = payload("gate", "get", {"k": 1})
        first, joined = (scope.handle_io("t", f"c{i}", p, None) for i in range(2))
        seen: list[tuple[str, Any]] = []
        first.deliver_to(lambda f: seen.append(("first", ok(f.result())["result"])))
        joined.deliver_to(lambda f: seen.append(("joined", ok(f.result())["result"])))
        gate.release("v")
        # No loop turn: the backend's set_result answered the flight and both waiters.
        assert seen == [("first", "v"), ("joined", "v")]
        assert scope.in_flight == 0
        # And the answer was cached: the next identical read is a hit, no backend call.
        again = scope.handle_io("t", "c9", p, None)
        assert ok(again)["result"] == "v" and gate.calls == 1
        await io.close()

    run(main())


def test_with_a_plain_future_the_answer_waits_for_a_loop_turn() -> None:
    """The same with GateBackend's plain futures: the flight answers a turn later (what
    BackendAnswer saves; this pins the test above to the difference)."""
    gate = GateBackend()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        pending = scope.handle_io("t", "c", payload("gate", "get", {"k": 1}), None)
        seen: list[str] = []
        pending.deliver_to(lambda f: seen.append("answered"))
        gate.release("v")
        assert seen == []
        await asyncio.sleep(0)
        assert seen == ["answered"]
        await io.close()

    run(main())


def test_an_abandoned_flight_cancels_its_backend_answer_and_is_not_answered() -> None:
    gate = DirectGate()

    async def main() -> None:
        io = subsystem(gate)
        scope = io.task_scope("t")
        pending = scope.handle_io("t", "c", payload("gate", "get", {"k": 1}), None)
        seen: list[bool] = []
        pending.deliver_to(lambda f: seen.append(f.cancelled()))
        (_op, _body, backend_future) = gate.open[0]
        assert pending.cancel()
        assert backend_future.cancelled()
        await asyncio.sleep(0.01)
        assert seen == [True]  # the waiter's own callback, once; the flight's never ran
        stats = scope.stats.operation("gate", "get")
        assert stats.abandoned == 1 and stats.backend_calls == 0
        # A later identical read starts afresh.
        again = scope.handle_io("t", "c2", payload("gate", "get", {"k": 1}), None)
        assert gate.calls == 2
        gate.release("w")
        assert ok(again.result())["result"] == "w"
        await io.close()

    run(main())


def test_set_exception_is_delivered_too_and_a_raising_callback_is_logged(caplog: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        future = BackendAnswer(loop=loop)
        seen: list[str] = []
        future.deliver_to(lambda f: seen.append(repr(f.exception())))
        future.set_exception(RuntimeError("boom"))
        assert seen == ["RuntimeError('boom')"]

        broken = BackendAnswer(loop=loop)

        def raises(_f: Any) -> None:
            raise ValueError("callback bug")

        broken.deliver_to(raises)
        broken.set_result(1)  # does not raise into the backend
        assert broken.result() == 1

    run(main())
    assert "the answer callback of an IO backend raised" in caplog.text


def test_on_cancel_runs_inside_cancel_once() -> None:
    async def main() -> None:
        future = BackendAnswer(loop=asyncio.get_running_loop())
        hooks: list[bool] = []
        future.on_cancel = lambda f: hooks.append(f.cancelled())
        assert future.cancel()
        assert hooks == [True]
        assert not future.cancel()
        assert hooks == [True]
        answered = BackendAnswer(loop=asyncio.get_running_loop())
        answered.on_cancel = lambda f: hooks.append(False)
        answered.set_result(1)
        assert not answered.cancel() and hooks == [True]

    run(main())
