"""``blockx serve`` end to end: a real server process, real executors, plain HTTP.

From the issue's words: tasks of several instances at once, every row exactly once,
the queue's fairness visible; a streamed task fed in ten POSTs; ``kill -9`` of the
server mid-task and a restart (the task finishes, ``rows?after=N`` returns each
remaining row once; several kill points); the SIGTERM drain; bad input answered with
a clear problem and nothing lost.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from tests.serve.server import Server, wait_for

pytestmark = pytest.mark.slow

DOUBLE = "def _(x):\n    return {'x': x, 'y': 2 * x}\n"


def _task(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "functions": {"double": {"source": DOUBLE}},
        "calls": [{"function": "double", "args": i} for i in range(n)],
        **extra,
    }


def _gated(gate: Path, n: int, gate_at: int) -> dict[str, Any]:
    """``n`` calls; those from ``gate_at`` on wait until the file ``gate`` exists."""
    source = (
        "import os, time\n"
        "def _(i):\n"
        f"    if i >= {gate_at}:\n"
        f"        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.01)\n"
        "    return {'i': i}\n"
    )
    return {
        "functions": {"gated": {"source": source}},
        "calls": [{"function": "gated", "args": i} for i in range(n)],
        "policy": {"call_budget_ms": 0},
    }


def test_many_tasks_of_four_instances_every_row_once_and_fair_starts(tmp_path: Path) -> None:
    # Two run slots, held by instance a's first two tasks until the gate opens: the
    # other 18 tasks queue (a submits first and most), and the queue decides who
    # starts next -- the instances in turn, not first come first served.
    gate = tmp_path / "gate"
    with Server(tmp_path / "data", "--set", "admission.executor_task_slots=2") as server:
        ids: dict[str, str] = {}
        for instance, count in (("a", 8), ("b", 4), ("c", 4), ("d", 4)):
            for k in range(count):
                task = {**_gated(gate, 300, 0), "instance": instance, "task_id": f"{instance}{k}"}
                ids[server.submit(task)] = instance
        states = wait_for(
            lambda: (s := [server.status(t)["state"] for t in ids]).count("running") == 2 and s,
            what="a's first two tasks running",
        )
        assert states.count("queued") == 18, states
        gate.touch()
        for task_id in ids:
            status = server.wait_finished(task_id)
            assert status["state"] == "succeeded", status
            assert status["summary"]["exit_code"] == 0
            assert (status["done"], status["succeeded"], status["rows"]) == (300, 300, 300)
            assert server.rows(task_id) == [{"i": i} for i in range(300)]  # each once, in order
        listed = server.request("GET", "/v1/tasks?state=succeeded").json()["tasks"]
        assert {t["id"] for t in listed} == set(ids)
        order = [ids[t["id"]] for t in sorted(listed, key=lambda t: t["started_at"])]
        # a's two, then the instances in turn: the next four starts are one of each.
        assert order[:2] == ["a", "a"], order
        assert sorted(order[2:6]) == ["a", "b", "c", "d"], order
        assert sorted(order[6:10]) == ["a", "b", "c", "d"], order


def test_a_streamed_task_fed_in_ten_posts(tmp_path: Path) -> None:
    with Server(tmp_path / "data") as server:
        reply = server.request(
            "POST",
            "/v1/tasks",
            {"functions": {"double": {"source": DOUBLE}}, "calls_stream": True},
        )
        assert reply.status == 201, reply
        task_id = reply.json()["id"]
        for part in range(10):
            body = "".join(
                json.dumps({"function": "double", "args": part * 100 + i}) + "\n"
                for i in range(100)
            ).encode()
            sent = server.request(
                "POST", f"/v1/tasks/{task_id}/calls", body, content_type="application/x-ndjson"
            )
            assert sent.status == 200, sent
            assert sent.json() == {"accepted": 100, "calls": (part + 1) * 100}
        assert server.status(task_id)["state"] in ("queued", "running")
        closed = server.request("POST", f"/v1/tasks/{task_id}/close")
        assert closed.status == 200, closed
        status = server.wait_finished(task_id)
        assert status["state"] == "succeeded", status
        assert server.rows(task_id) == [{"x": i, "y": 2 * i} for i in range(1000)]
        late = server.request(
            "POST",
            f"/v1/tasks/{task_id}/calls",
            b'{"function": "double", "args": 1}\n',
            content_type="application/x-ndjson",
        )
        assert late.status == 409, late


def test_rows_stream_while_the_task_runs_and_end_with_it(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with Server(tmp_path / "data", "--set", "stream_build.batch_max_rows=50") as server:
        task_id = server.submit(_gated(gate, 400, 200))
        wait_for(lambda: server.status(task_id)["done"] >= 200, what="the first 200 calls")
        import http.client

        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        conn.request("GET", f"/v1/tasks/{task_id}/rows?after=10")
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("application/x-ndjson")
        first = [json.loads(response.readline()) for _ in range(190)]
        assert first == [{"i": i} for i in range(10, 200)]
        gate.touch()
        rest = [json.loads(line) for line in response.read().splitlines() if line.strip()]
        conn.close()
        assert rest == [{"i": i} for i in range(200, 400)]
        assert server.wait_finished(task_id)["rows"] == 400


@pytest.mark.parametrize("gate_at", [0, 150, 320])
def test_kill_9_mid_task_then_restart_every_row_once(tmp_path: Path, gate_at: int) -> None:
    gate = tmp_path / "gate"
    data = tmp_path / "data"
    server = Server(data, "--set", "stream_build.batch_max_rows=40").start()
    try:
        task_id = server.submit(_gated(gate, 400, gate_at))
        wait_for(
            lambda: server.status(task_id)["done"] >= gate_at // 40 * 40,
            what=f"the calls before {gate_at}",
        )
        seen: list[Any] = []  # the rows a client read before the crash
        if gate_at:
            import http.client

            conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
            conn.request("GET", f"/v1/tasks/{task_id}/rows")
            response = conn.getresponse()
            stored = gate_at // 40 * 40
            seen = [json.loads(response.readline()) for _ in range(stored)]
            conn.close()
    finally:
        server.kill()
    assert seen == [{"i": i} for i in range(len(seen))]
    gate.touch()
    with Server(data) as again:
        status = again.wait_finished(task_id)
        assert status["state"] == "succeeded", status
        assert status["rows"] == 400 and status["done"] == 400
        rest = again.rows(task_id, after=len(seen))
        assert seen + rest == [{"i": i} for i in range(400)]


def test_sigterm_drains_then_the_next_start_resumes(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    data = tmp_path / "data"
    server = Server(data, "--drain-timeout", "0.5", "--set", "stream_build.batch_max_rows=40")
    server.start()
    task_id = server.submit(_gated(gate, 200, 80))
    wait_for(lambda: server.status(task_id)["done"] >= 80, what="the first 80 calls")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0, server.stderr
    assert "draining" in server.stderr
    gate.touch()
    with Server(data) as again:
        status = again.wait_finished(task_id)
        assert status["state"] == "succeeded", status
        assert again.rows(task_id) == [{"i": i} for i in range(200)]


def test_a_finished_and_a_cancelled_task(tmp_path: Path) -> None:
    gate = tmp_path / "never"
    with Server(tmp_path / "data") as server:
        task_id = server.submit(_gated(gate, 50, 10))
        wait_for(lambda: server.status(task_id)["state"] == "running", what="running")
        reply = server.request("DELETE", f"/v1/tasks/{task_id}")
        assert reply.status == 202, reply
        status = server.wait_finished(task_id)
        assert status["state"] == "cancelled"
        assert status["failure"]["kind"] == "CANCELLED"
        assert status["summary"]["exit_code"] == 1
        purge = server.request("DELETE", f"/v1/tasks/{task_id}?purge=true")
        assert purge.status == 204
        assert server.request("GET", f"/v1/tasks/{task_id}").status == 404


def test_failures_are_listed_with_the_user_stack(tmp_path: Path) -> None:
    source = "def _(x):\n    if x % 3 == 0:\n        raise ValueError(f'bad {x}')\n    return x\n"
    task = {
        "functions": {"f": {"source": source}},
        "calls": [{"function": "f", "args": i} for i in range(9)],
        "policy": {"failure": "continue", "max_attempts": 1},
    }
    with Server(tmp_path / "data") as server:
        task_id = server.submit(task)
        status = server.wait_finished(task_id)
        assert status["state"] == "succeeded"
        assert (status["succeeded"], status["failed"]) == (6, 3)
        assert status["summary"]["exit_code"] == 1
        assert status["summary"]["failures_by_kind"] == {"user_error": 3}
        failures = server.request("GET", f"/v1/tasks/{task_id}/failures").lines()
        assert [f["index"] for f in failures] == [0, 3, 6]
        assert failures[1]["function"] == "f" and failures[1]["args"] == 3
        assert "bad 3" in failures[1]["message"]
        assert "raise ValueError" in (failures[1]["stack"] or "")
        assert server.rows(task_id) == [1, 2, 4, 5, 7, 8]


# --- bad input -------------------------------------------------------------------------------


def _problem(reply: Any, status: int) -> dict[str, Any]:
    assert reply.status == status, reply
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    body = reply.json()
    assert body["status"] == status and body["title"] and body["detail"]
    return dict(body)


def test_bad_input_gets_a_clear_problem_and_nothing_is_lost(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.py").write_text(DOUBLE)
    (tmp_path / "secret.py").write_text(DOUBLE)
    with Server(tmp_path / "data", "--functions-root", str(root), "--max-body", "1000000") as s:
        good = s.submit(_task(100))
        bad_json = s.request(
            "POST", "/v1/tasks", b'{"functions": ', content_type="application/json"
        )
        assert "JSON" in _problem(bad_json, 400)["detail"]
        big = s.request("POST", "/v1/tasks", b"x" * 100_000_000, content_type="application/json")
        assert "1,000,000" in _problem(big, 413)["detail"]
        assert _problem(s.request("GET", "/v1/tasks/t-0123456789abcdef"), 404)
        assert _problem(s.request("GET", "/v1/tasks/../../etc"), 404)
        assert _problem(s.request("GET", "/v1/tasks/nonsense/rows"), 404)
        escape = s.request(
            "POST", "/v1/tasks", {**_task(1), "functions": {"double": {"path": "../secret.py"}}}
        )
        problems = _problem(escape, 400)["problems"]
        assert any("functions root" in p["message"] for p in problems), problems
        inside = s.request(
            "POST", "/v1/tasks", {**_task(2), "functions": {"double": {"path": "ok.py"}}}
        )
        assert inside.status == 201, inside
        syntax = s.request(
            "POST",
            "/v1/tasks",
            {**_task(1), "functions": {"double": {"source": "def _(x):\n    return (\n"}}},
        )
        (syntax_problem,) = _problem(syntax, 400)["problems"]
        # The function, the "file" (its source in the task) and the line:column.
        assert syntax_problem["path"] == "$.functions.double.source"
        assert "(functions.double.source):2:12: SyntaxError" in syntax_problem["message"]
        assert "function 'double'" in syntax_problem["message"]
        policy = s.request("POST", "/v1/tasks", {**_task(1), "policy": {"max_attempts": "three"}})
        paths = [p["path"] for p in _problem(policy, 400)["problems"]]
        assert "$.policy.max_attempts" in paths
        wrong_type = s.request("POST", "/v1/tasks", b"<xml/>", content_type="text/xml")
        _problem(wrong_type, 415)
        status = s.wait_finished(good)
        assert status["state"] == "succeeded" and status["rows"] == 100


def test_the_token_guards_everything_but_health(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    os.chmod(token_file, 0o600)
    with Server(tmp_path / "data", "--token-file", str(token_file), token="s3cret-token") as s:
        assert s.request("GET", "/healthz", token=None).status == 200
        assert s.request("GET", "/readyz", token=None).status == 200
        assert s.request("GET", "/openapi.json", token=None).status == 401
        assert s.request("GET", "/openapi.json").json()["openapi"].startswith("3.1")
        missing = _problem(s.request("GET", "/v1/tasks", token=None), 401)
        assert "Bearer" in missing["detail"]
        wrong = _problem(s.request("GET", "/v1/tasks", token="nope"), 401)
        assert "not the server's" in wrong["detail"]
        assert s.request("GET", "/v1/tasks").status == 200
        assert s.wait_finished(s.submit(_task(5)))["rows"] == 5


def test_a_public_address_without_a_token_is_refused(tmp_path: Path) -> None:
    from tests.cli.cli_support import blockx

    done = blockx("serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "--token-file" in done.stderr and "loopback" in done.stderr


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from tests.cli.cli_support import blockx

    with Server(tmp_path / "data"):
        done = blockx("serve", "--port", "0", "--data-dir", str(tmp_path / "data"))
        assert done.returncode == 2
        assert "another blockx serve is using" in done.stderr


def test_a_full_queue_answers_429_with_retry_after(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    args = ("--queue-limit", "1", "--set", "admission.executor_task_slots=1")
    with Server(tmp_path / "data", *args) as server:
        running = server.submit(_gated(gate, 5, 0))
        wait_for(lambda: server.status(running)["state"] == "running", what="the first task")
        waiting = server.submit(_task(3))
        full = server.request("POST", "/v1/tasks", _task(3))
        assert full.status == 429, full
        assert int(full.headers["Retry-After"]) > 0
        assert "waiting" in full.json()["detail"]
        gate.touch()
        assert server.wait_finished(running)["state"] == "succeeded"
        assert server.wait_finished(waiting)["rows"] == 3
        assert server.request("POST", "/v1/tasks", _task(3)).status == 201


def test_while_draining_new_work_is_refused_and_running_tasks_finish(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    server = Server(tmp_path / "data", "--drain-timeout", "120").start()
    task_id = server.submit(_gated(gate, 20, 10))
    wait_for(
        lambda: (
            server.status(task_id)["done"] >= 0 and server.status(task_id)["state"] == "running"
        ),
        what="running",
    )
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.request("GET", "/readyz").status == 503, what="readyz 503")
    refused = server.request("POST", "/v1/tasks", _task(1))
    assert refused.status == 503 and "shutting down" in refused.json()["detail"]
    assert server.status(task_id)["state"] == "running"
    gate.touch()  # the running task may finish within the drain timeout
    assert server.proc.wait(120) == 0, server.stderr
    with Server(tmp_path / "data") as again:
        status = again.status(task_id)
        assert status["state"] == "succeeded" and status["rows"] == 20


def test_a_fast_fail_task_names_the_call_that_stopped_it(tmp_path: Path) -> None:
    source = "def _(x):\n    if x == 5:\n        raise KeyError('five')\n    return x\n"
    task = {
        "functions": {"f": {"source": source}},
        "calls": [{"function": "f", "args": i} for i in range(6)],
        "policy": {"failure": "fast_fail", "max_attempts": 1},
    }
    with Server(tmp_path / "data") as server:
        status = server.wait_finished(server.submit(task))
        assert status["state"] == "failed", status
        failure = status["failure"]
        assert (failure["kind"], failure["call_index"], failure["error_kind"]) == (
            "CALL_FAILED",
            5,
            "user_error",
        )
        assert status["summary"]["exit_code"] == 1
        assert [
            f["index"] for f in server.request("GET", f"/v1/tasks/{status['id']}/failures").lines()
        ] == [5]


def test_require_audit_applies_to_every_submitted_function(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--require-audit") as server:
        off = server.request("POST", "/v1/tasks", {**_task(1), "audit": False})
        assert off.status == 400, off
        assert any(p["path"] == "$.audit" for p in off.json()["problems"])
        escaping = {
            "functions": {"f": {"source": "import os\ndef _(x):\n    return os.getcwd()\n"}},
            "calls": [{"function": "f", "args": 1}],
        }
        refused = server.request("POST", "/v1/tasks", escaping)
        assert refused.status == 400, refused
        assert "os" in json.dumps(refused.json()["problems"])
        status = server.wait_finished(server.submit(_task(3)))  # clean code runs, audited
        assert status["state"] == "succeeded" and status["rows"] == 3


def test_finished_tasks_are_purged_after_the_retention(tmp_path: Path) -> None:
    # --retention in days: 0.00002 days is 1.7 s; the purge looks every second.
    with Server(tmp_path / "data", "--retention", "0.00002") as server:
        task_id = server.submit(_task(2))
        server.wait_finished(task_id)
        wait_for(
            lambda: server.request("GET", f"/v1/tasks/{task_id}").status == 404,
            what="the finished task to be purged",
        )


def test_a_token_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok")
    os.chmod(token_file, 0o644)
    with Server(tmp_path / "data", "--token-file", str(token_file), token="tok") as server:
        assert "can be read by other users" in server.stderr
        assert "chmod 600" in server.stderr


def test_calls_posted_past_the_window_are_held_until_calls_settle(tmp_path: Path) -> None:
    import threading

    gate = tmp_path / "gate"
    gated = _gated(gate, 0, 0)
    with Server(tmp_path / "data", "--stream-window", "50") as server:
        task = {"functions": gated["functions"], "calls_stream": True}
        task_id = server.request("POST", "/v1/tasks", task).json()["id"]

        def calls(first: int, n: int) -> bytes:
            return "".join(
                json.dumps({"function": "gated", "args": i}) + "\n" for i in range(first, first + n)
            ).encode()

        path = f"/v1/tasks/{task_id}/calls"
        first = server.request("POST", path, calls(0, 60), content_type="application/x-ndjson")
        assert first.json() == {"accepted": 60, "calls": 60}
        answers: list[Any] = []
        held = threading.Thread(
            target=lambda: answers.append(
                server.request("POST", path, calls(60, 40), content_type="application/x-ndjson")
            )
        )
        held.start()
        held.join(1.0)
        assert held.is_alive() and not answers  # 60 stored, none done: past the window of 50
        gate.touch()
        held.join(60)
        assert answers and answers[0].json() == {"accepted": 40, "calls": 100}
        server.request("POST", f"/v1/tasks/{task_id}/close")
        assert server.rows(task_id) == [{"i": i} for i in range(100)]


def test_a_cancel_survives_a_crash_before_the_run_ends(tmp_path: Path) -> None:
    # The server is killed as soon as it answered the cancel (stored before its 202),
    # while the call spins: the run ends cancelled ~50 ms after the 202 (the core does not
    # wait for a call that cannot yield), so the kill nearly always lands first. Either
    # way the task must end cancelled after the restart -- not run again and succeed (the
    # gate is open by then). Its state is not read between the 202 and the kill: whether
    # the run had ended by then is a race, and was this test's flake.
    gate = tmp_path / "gate"
    spinning = tmp_path / "spinning"
    source = (
        "import os\n"
        "def _(i):\n"
        f"    if not os.path.exists({str(gate)!r}):\n"
        f"        open({str(spinning)!r}, 'w').close()\n"
        f"    while not os.path.exists({str(gate)!r}):\n"
        "        pass\n"
        "    return {'i': i}\n"
    )
    task = {
        "functions": {"spin": {"source": source}},
        "calls": [{"function": "spin", "args": 0}],
        "policy": {"call_budget_ms": 0},
    }
    data = tmp_path / "data"
    server = Server(data).start()
    try:
        task_id = server.submit(task)
        wait_for(spinning.exists, what="the call spinning")
        assert server.status(task_id)["state"] == "running"
        assert server.request("DELETE", f"/v1/tasks/{task_id}").status == 202
    finally:
        server.kill()
    gate.touch()
    with Server(data) as again:
        status = again.wait_finished(task_id)
        assert status["state"] == "cancelled", status
        assert status["rows"] == 0
        assert status["failure"]["message"] == "cancelled through the API"


def test_a_cancelled_tasks_call_stuck_in_pure_cpu_work_frees_its_executor(
    tmp_path: Path,
) -> None:
    # No budget, a loop that never yields: the cancel must still end it in its executor,
    # or that executor computes for good and the next task's calls placed there wait
    # forever (before: the next task of 200 trivial calls had not finished after 10 s).
    gate = tmp_path / "gate"  # never made while the server runs: the loop never ends
    spinning = tmp_path / "spinning"
    source = (
        "import os\n"
        "def _(i):\n"
        f"    open({str(spinning)!r}, 'w').close()\n"
        f"    while not os.path.exists({str(gate)!r}):\n"
        "        pass\n"
        "    return {'i': i}\n"
    )
    with Server(tmp_path / "data") as server:
        stuck = server.submit(
            {
                "functions": {"spin": {"source": source}},
                "calls": [{"function": "spin", "args": 0}],
                "policy": {"call_budget_ms": 0},
            }
        )
        wait_for(spinning.exists, what="the call spinning")
        assert server.request("DELETE", f"/v1/tasks/{stuck}").status == 202
        assert server.wait_finished(stuck)["state"] == "cancelled"
        after = server.submit(_task(200))
        status = server.wait_finished(after, timeout=60)
        assert status["state"] == "succeeded" and status["rows"] == 200, status
        assert sorted(r["x"] for r in server.rows(after)) == list(range(200))
