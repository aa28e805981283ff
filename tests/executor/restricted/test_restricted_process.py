"""A real ``python -m blockx.executor``: an audited ExecuteCall runs restricted, with
debug output captured from the restricted ``print``, and a plain one does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[3]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.helpers.fake_worker import FakeWorker  # noqa: E402

from blockx.audit import audit_source  # noqa: E402
from blockx.wire import keys  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

SOURCE = """\
from datetime import timedelta

def _(p):
    print("day", p)
    when = datetime.strptime(p, "%Y-%m-%d") + timedelta(days=1)
    return {"next": when.strftime("%Y-%m-%d"), "j": json.dumps([1])}
"""

PROBE = """\
def _(p):
    try:
        return open.__name__
    except NameError:
        return "restricted"
"""


def test_the_executor_process_runs_audited_calls_restricted() -> None:
    verdict = audit_source(SOURCE, "fn")
    assert verdict.accepted, verdict.violations
    with FakeWorker() as worker:
        audited = worker.execute_call_envelope("c1", source=SOURCE, args="2026-06-10", debug=True)
        audited[keys.F_PAYLOAD][keys.FP_AUDIT] = verdict.audit_payload()
        worker.send(audited)
        probe = worker.execute_call_envelope("c2", source=PROBE, task_id="task-2")
        probe[keys.F_PAYLOAD][keys.FP_AUDIT] = audit_source(PROBE, "fn").audit_payload()
        worker.send(probe)
        worker.execute_call("c3", source=PROBE, task_id="task-3")
        done = worker.collect_terminals(["c1", "c2", "c3"])
    first = done["c1"].envelope
    assert first[keys.F_MESSAGE_TYPE] == keys.MT_CALL_COMPLETED, first
    assert first[keys.F_PAYLOAD][keys.FP_OUTPUT] == {"next": "2026-06-11", "j": "[1]"}
    assert first[keys.F_PAYLOAD][keys.FP_DEBUG_OUTPUT] == "day 2026-06-10\n"
    assert done["c2"].envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] == "restricted"
    assert done["c3"].envelope[keys.F_PAYLOAD][keys.FP_OUTPUT] == "open"
