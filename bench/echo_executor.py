"""A stand-in executor for benchmarks: answers every ExecuteCall at once, runs no code.

Speaks just enough of docs/protocol.md to measure the worker alone: a Heartbeat on
connect and every 0.5 s (``availableContexts`` = ``--executor-max-inflight``),
and for each ``ExecuteCall`` of ``args = {"x": n}`` a ``CallCompleted`` with
``{"y": n + 1}`` — batched, one write per read. With ``ECHO_IO_READS=k`` each
call first does k sequential IO waits (``CallWaiting(io)`` ``blockdb``/``get_row``
with ``params {"table": "t", "key": x*k+i}``, one at a time, each answered by a
``ResumeCall``) and then completes with ``{"total": sum of the results' v}``.
Started by
bench/worker_throughput.py through the pool's ``argv_factory``; accepts the
real executor's flags.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import threading
import time

import orjson

_HEADER = struct.Struct(">I")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--socket-path", required=True)
    parser.add_argument("--executor-max-inflight", type=int, default=128)
    parser.add_argument("--executor-max-runnable", type=int, default=128)
    parser.add_argument("--heartbeat-interval", type=float, default=1.0)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(args.socket_path)
    lock = threading.Lock()
    seq = 0

    def heartbeat() -> bytes:
        nonlocal seq
        seq += 1
        body = orjson.dumps(
            {
                "messageType": "Heartbeat",
                "executorId": args.executor_id,
                "payload": {
                    "executorId": args.executor_id,
                    "heartbeatSeq": seq,
                    "runnableCount": 0,
                    "inflightCount": 0,
                    "availableContexts": args.executor_max_inflight,
                    "memoryBytes": 0,
                    "lastSchedulerActiveAtMs": int(time.time() * 1000),
                    "runningCallId": None,
                    "executorProcessInstanceId": f"echo-{os.getpid()}",
                },
            }
        )
        return _HEADER.pack(len(body)) + body

    def beat() -> None:
        while True:
            time.sleep(0.5)
            with lock:
                try:
                    sock.sendall(heartbeat())
                except OSError:
                    return

    with lock:
        sock.sendall(heartbeat())
    threading.Thread(target=beat, daemon=True).start()
    buffer = b""
    dumps = orjson.dumps
    loads = orjson.loads
    reads = int(os.environ.get("ECHO_IO_READS", "0"))
    # call id -> [task id, attempt, x, reads done, total]
    calls: dict[str, list] = {}
    request_seq = 0

    def frame(envelope: dict) -> bytes:
        body = dumps(envelope)
        return _HEADER.pack(len(body)) + body

    def wait_io(call_id: str, state: list) -> bytes:
        nonlocal request_seq
        request_seq += 1
        return frame(
            {
                "messageType": "CallWaiting",
                "callId": call_id,
                "requestId": f"req-{request_seq}",
                "executorId": args.executor_id,
                "payload": {
                    "taskId": state[0],
                    "attemptSeq": state[1],
                    "waitKind": "io",
                    "ioKind": "read",
                    "backend": "blockdb",
                    "operation": "get_row",
                    "params": {"table": "t", "key": state[2] * reads + state[3]},
                    "cacheKey": None,
                },
            }
        )

    def complete(call_id: str, task_id: str, attempt: int, output: object) -> bytes:
        return frame(
            {
                "messageType": "CallCompleted",
                "callId": call_id,
                "executorId": args.executor_id,
                "payload": {
                    "taskId": task_id,
                    "attemptSeq": attempt,
                    "output": output,
                    "budgetUsedMs": 0,
                },
            }
        )

    while True:
        data = sock.recv(1 << 20)
        if not data:
            os._exit(0)
        buffer += data
        out = []
        pos = 0
        size = len(buffer)
        while size - pos >= 4:
            (length,) = _HEADER.unpack_from(buffer, pos)
            if size - pos - 4 < length:
                break
            envelope = loads(buffer[pos + 4 : pos + 4 + length])
            pos += 4 + length
            message_type = envelope.get("messageType")
            if message_type == "ExecuteCall":
                payload = envelope["payload"]
                call_id = envelope["callId"]
                x = payload["args"]["x"]
                if reads:
                    state = [payload["taskId"], payload["attemptSeq"], x, 0, 0]
                    calls[call_id] = state
                    out.append(wait_io(call_id, state))
                else:
                    out.append(
                        complete(call_id, payload["taskId"], payload["attemptSeq"], {"y": x + 1})
                    )
            elif message_type == "ResumeCall":
                call_id = envelope["callId"]
                state = calls.get(call_id)
                if state is None:
                    continue
                state[3] += 1
                state[4] += envelope["payload"]["result"]["v"]
                if state[3] < reads:
                    out.append(wait_io(call_id, state))
                else:
                    del calls[call_id]
                    out.append(complete(call_id, state[0], state[1], {"total": state[4]}))
        buffer = buffer[pos:]
        if out:
            with lock:
                sock.sendall(b"".join(out))


if __name__ == "__main__":
    main()
