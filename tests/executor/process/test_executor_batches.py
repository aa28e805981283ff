"""A real executor process and batched frames (docs/protocol.md "Batched frames"):
it announces ``features: ["batch"]`` in every heartbeat, sends plain frames until the
worker's ack carries the feature, batched ones after; a v1 worker (no ack, or an ack
without features) never gets a batched frame. The worker's batches are decoded too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tests.helpers.fake_worker import FakeWorker

from blockx.wire import FEATURE_BATCH, encode_batch, encode_frame, keys

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

StartWorker = Callable[..., FakeWorker]

ECHO = """\
def _(x):
    return {"y": x + 1}
"""

CALLS = 60


def _ack(features: list[str] | None) -> dict[str, Any]:
    payload: dict[str, Any] = {} if features is None else {keys.FP_FEATURES: features}
    return {keys.F_MESSAGE_TYPE: keys.MT_HEARTBEAT_ACK, keys.F_PAYLOAD: payload}


def _run_calls(worker: FakeWorker, prefix: str) -> None:
    """CALLS calls sent in one write, every one completed exactly once with its output."""
    envelopes = [
        worker.execute_call_envelope(f"{prefix}{i}", source=ECHO, args=i) for i in range(CALLS)
    ]
    worker.send_many((envelope, None) for envelope in envelopes)
    done = worker.collect_terminals([f"{prefix}{i}" for i in range(CALLS)], timeout=30)
    for i in range(CALLS):
        frame = done[f"{prefix}{i}"]
        assert frame.message_type == keys.MT_CALL_COMPLETED, frame
        assert frame.envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"y": i + 1}


def _wait_for_ack_count(worker: FakeWorker, heartbeats_before: int) -> None:
    # The ack is handled by the main loop; a heartbeat sent after it proves the loop ran.
    worker.wait_heartbeat(
        lambda f: f.envelope[keys.F_PAYLOAD][keys.FP_HEARTBEAT_SEQ] > heartbeats_before + 1
    )


def test_every_heartbeat_announces_batch(start_worker: StartWorker) -> None:
    worker = start_worker(heartbeat_interval=0.05)
    worker.wait_heartbeat(lambda f: f.envelope[keys.F_PAYLOAD][keys.FP_HEARTBEAT_SEQ] >= 3)
    for frame in list(worker.heartbeats):
        assert frame.envelope[keys.F_PAYLOAD][keys.FP_FEATURES] == [FEATURE_BATCH]


def test_plain_frames_until_the_ack_then_batches(start_worker: StartWorker) -> None:
    worker = start_worker(sources={"echo": ECHO}, heartbeat_interval=0.05)
    _run_calls(worker, "before-")
    assert worker.outer_frames.batched == 0
    seq = len(worker.heartbeats)
    worker.send(_ack([FEATURE_BATCH]))
    _wait_for_ack_count(worker, seq)
    _run_calls(worker, "after-")
    assert worker.outer_frames.batched >= 1


@pytest.mark.parametrize("ack", [None, []], ids=["v1-ack", "empty-features"])
def test_a_v1_worker_only_ever_gets_plain_frames(start_worker: StartWorker, ack) -> None:
    worker = start_worker(sources={"echo": ECHO}, heartbeat_interval=0.05)
    worker.send(_ack(ack))
    _wait_for_ack_count(worker, len(worker.heartbeats))
    _run_calls(worker, "a-")
    _run_calls(worker, "b-")
    assert worker.outer_frames.batched == 0
    assert worker.outer_frames.frames >= 2 * CALLS


def test_the_executor_decodes_the_workers_batched_frames(start_worker: StartWorker) -> None:
    worker = start_worker(sources={"echo": ECHO})
    bodies = [
        encode_frame(worker.execute_call_envelope(f"c{i}", source=ECHO, args=i))[4:]
        for i in range(CALLS)
    ]
    worker.send_bytes(encode_batch(bodies))
    done = worker.collect_terminals([f"c{i}" for i in range(CALLS)], timeout=30)
    assert {call_id: f.envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] for call_id, f in done.items()} == {
        f"c{i}": {"y": i + 1} for i in range(CALLS)
    }
