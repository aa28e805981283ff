"""A real round trip between two processes over the BlockX wire protocol.

The parent plays the worker: it listens on a Unix socket, waits for the
child's first Heartbeat (which attaches the connection, as PROTOCOL.md says),
sends ExecuteCall frames, and reads back CallCompleted frames. The child plays
a minimal executor that adds two numbers. Both sides use ``blockx.wire`` only.

    python examples/wire_roundtrip.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import orjson

from blockx import wire
from blockx.wire import keys


def child(socket_path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    decoder = wire.FrameDecoder()
    heartbeat = wire.Heartbeat(executor_id="exec-demo", heartbeat_seq=1, available_contexts=128)
    sock.sendall(
        wire.encode_frame(
            wire.build_envelope(keys.MT_HEARTBEAT, heartbeat, executor_id="exec-demo")
        )
    )
    while True:
        data = sock.recv(65536)
        if not data:
            decoder.close()
            return
        for frame in decoder.feed(data):
            message = wire.parse_message(frame)
            if not isinstance(message.payload, wire.ExecuteCall):
                continue
            args = message.payload.args
            done = wire.CallCompleted(
                task_id=message.payload.task_id,
                attempt_seq=message.payload.attempt_seq,
                output=orjson.Fragment(wire.dumps_wire({"sum": args["left"] + args["right"]})),
            )
            sock.sendall(
                wire.encode_frame(
                    wire.build_envelope(
                        keys.MT_CALL_COMPLETED,
                        done,
                        call_id=message.call_id,
                        executor_id="exec-demo",
                    )
                )
            )


def recv_frames(sock: socket.socket, decoder: wire.FrameDecoder) -> list[wire.Frame]:
    data = sock.recv(65536)
    if not data:
        raise ConnectionError("the child closed the connection")
    return decoder.feed(data)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="blockx-demo-") as tmp:
        socket_path = os.path.join(tmp, "worker.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(socket_path)
        server.listen(1)
        server.settimeout(10)
        proc = subprocess.Popen([sys.executable, __file__, "--child", socket_path])
        try:
            conn, _ = server.accept()
            conn.settimeout(10)
            decoder = wire.FrameDecoder()
            first = recv_frames(conn, decoder)[0]
            print(f"attached {first.envelope['executorId']} (first frame: {first.message_type})")
            calls = [{"left": i, "right": i * i} for i in range(5)]
            start = time.perf_counter()
            for i, args in enumerate(calls):
                call = wire.ExecuteCall(
                    task_id="demo",
                    function_id="adder",
                    function_code_digest="sha256:" + "0" * 64,
                    args=args,
                    call_budget_ms=5000,
                )
                env = wire.build_envelope(keys.MT_EXECUTE_CALL, call, call_id=f"demo/c{i}")
                conn.sendall(wire.encode_frame(env))
            outputs: dict[str, object] = {}
            while len(outputs) < len(calls):
                for frame in recv_frames(conn, decoder):
                    message = wire.parse_message(frame)
                    assert isinstance(message.payload, wire.CallCompleted)
                    outputs[message.call_id or ""] = message.payload.output
            elapsed = (time.perf_counter() - start) * 1e3
            for call_id in sorted(outputs):
                print(f"{call_id}: {orjson.dumps(outputs[call_id]).decode()}")
            print(f"{len(outputs)} calls answered over the wire in {elapsed:.1f} ms")
            conn.close()
        finally:
            proc.wait(timeout=10)
            server.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
