"""A stream's ``CallBatch`` items (several calls per item, as ``blockx run`` reads a calls
file): the same calls, batches, rows and failure reports as one ``Call`` per item, on
real executor processes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import ADDER, WorkerSession, e2e_config

from blockx.worker.api import FLUSH, Call, CallBatch, Task, TaskPolicy, TaskSpecError

pytestmark = [pytest.mark.timeout(120)]

FAILS_ON_3 = """
def _(p):
    if p["x"] == 3:
        raise ValueError("call three fails")
    return {"y": p["x"] + 1}
"""


def _mixed(total: int, per_batch: int) -> Iterator[Any]:
    """``total`` adder calls: CallBatch items of ``per_batch`` pairs, with a single Call
    (and a FLUSH-free tuple pair) between every two of them."""
    i = 0
    while i < total:
        n = min(per_batch, total - i)
        yield CallBatch([("adder", {"x": x}) for x in range(i, i + n)])
        i += n
        if i < total:
            yield Call("adder", {"x": i})
            i += 1
        if i < total:
            yield ("adder", {"x": i})
            i += 1


def test_call_batches_are_cut_into_the_streams_batches_like_single_calls() -> None:
    config = e2e_config(**{"stream_build.batch_max_rows": 100})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            handle = session.worker.submit(
                Task(functions={"adder": ADDER}, calls=_mixed(1000, 37)), collect=False
            )
            batches = []
            rows: list[int] = []
            async for batch in handle.settled_batches():
                batches.append((batch.first_call, batch.call_count))
                rows.extend(r["y"] for r in batch.rows)
            result = await handle.result()
            assert result.success and result.stats.calls == result.stats.succeeded == 1000
            assert batches == [(first, 100) for first in range(0, 1000, 100)]
            assert rows == list(range(1, 1001))  # every call once, in call order

        session.run(scenario())


def test_argument_bytes_cut_a_call_batch_too() -> None:
    # {"x":NNN} is 9 bytes: a batch closes at the call that reaches 45 bytes.
    config = e2e_config(**{"stream_build.batch_max_args_bytes": 45})
    with WorkerSession(config) as session:

        async def scenario() -> None:
            pairs = [("adder", {"x": x}) for x in range(100, 112)]
            handle = session.worker.submit(
                Task(functions={"adder": ADDER}, calls=iter([CallBatch(pairs)])), collect=False
            )
            sizes = [batch.call_count async for batch in handle.settled_batches()]
            result = await handle.result()
            assert result.success and result.stats.succeeded == 12
            assert sizes == [5, 5, 2]

        session.run(scenario())


def test_a_failed_call_of_a_call_batch_is_reported_with_its_function_and_args() -> None:
    with WorkerSession(e2e_config()) as session:

        async def scenario() -> None:
            def calls() -> Iterator[Any]:
                yield Call("f", {"x": 0})
                yield CallBatch([("f", {"x": x}) for x in range(1, 6)])
                yield FLUSH

            result = await session.worker.run_task(
                Task(
                    functions={"f": FAILS_ON_3},
                    calls=calls(),
                    policy=TaskPolicy(max_attempts=1, failure="continue"),
                )
            )
            assert result.stats.succeeded == 5
            [failure] = result.errors
            assert (failure.index, failure.function_id, failure.args) == (3, "f", {"x": 3})
            assert failure.kind == "user_error" and "call three fails" in failure.message

        session.run(scenario())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ((7, {"x": 1}), r"call #2 must be a Call or a \(function_id, args\) pair"),
        (("adder", {"x": object()}), r"call #2 \(adder\): args:"),
    ],
)
def test_a_bad_call_in_a_call_batch_ends_the_task_naming_its_index(
    bad: tuple[Any, Any], message: str
) -> None:
    with WorkerSession(e2e_config()) as session:

        async def scenario() -> None:
            batch = CallBatch([("adder", {"x": 0}), ("adder", {"x": 1}), bad])
            handle = session.worker.submit(
                Task(functions={"adder": ADDER}, calls=iter([batch])), collect=False
            )
            with pytest.raises(TaskSpecError, match=message):
                await handle.result()
            assert session.worker.orchestrator.live_task_ids == []

        session.run(scenario())
