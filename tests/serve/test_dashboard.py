"""The dashboard of ``blockx serve`` (``GET /``), from issue #20's words.

* In a real browser, as a person would: a real server, a task submitted, the page
  opened in Debian's headless ``chromium`` through ``chromedriver`` (selenium; never a
  browser downloaded at test time), waited on until the task shows as succeeded; the
  task row, the two plots and the executor table checked in the DOM; a screenshot saved
  next to the test's output (its path printed). Skipped, with the reason, where chromium,
  chromedriver or selenium are missing (``scripts/install-system-deps.sh`` installs them).
* The JSON state ``GET /v1/dashboard`` of a real server, and the token: the page is
  public (it holds no data), the state is not.
* The history's sampling (rates, per-second IO percentiles, CPU %), fed made-up counters.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.serve.server import Server, wait_for

from blockx.serve.dashboard import (
    FINISHED_SHOWN,
    PUBLIC_PATHS,
    Counters,
    DashboardHistory,
    _backend_histograms,
    interval_quantile,
)

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

#: Reads and writes a table (IO through the blockdb backend), so the IO plot has data.
COUNT = (
    "def _(i):\n"
    "    t = Table('hits')\n"
    "    n = (t.get_row(i % 13) or {'n': 0})['n'] + 1\n"
    "    t.upsert_row({'key': i % 13, 'n': n})\n"
    "    return {'i': i, 'n': n}\n"
)


def _task(n: int) -> dict[str, Any]:
    return {
        "functions": {"count": {"source": COUNT}},
        "calls": [{"function": "count", "args": i} for i in range(n)],
    }


def _server(tmp_path: Path, *args: str, token: str | None = None) -> Server:
    """A server whose table store lives under ``tmp_path`` (not in the working dir)."""
    extra: list[str] = ["--set", f"io.blockdb.sqlite_path={tmp_path / 'blockdb.sqlite3'}"]
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        os.chmod(token_file, 0o600)
        extra += ["--token-file", str(token_file)]
    return Server(tmp_path / "data", *extra, *args, token=token)


# --- the history (no server) ----------------------------------------------------------------


def _hist(*pairs: tuple[float, int]) -> tuple[tuple[float, int], ...]:
    return (*pairs, (math.inf, pairs[-1][1] if pairs else 0))


def test_the_history_turns_cumulative_counters_into_rates() -> None:
    history = DashboardHistory(points=3)
    assert history.observe(100.0, Counters(calls=10, rows=10)) is None  # the first reading
    sample = history.observe(102.0, Counters(calls=50, rows=30))
    assert sample is not None
    assert sample.calls_per_s == 20.0 and sample.rows_per_s == 10.0
    # A counter that went back (a restart of its source) counts as nothing, not negative.
    assert history.observe(103.0, Counters(calls=5, rows=None)).calls_per_s == 0.0  # type: ignore[union-attr]
    # The clock not moving makes no sample; only the last `points` are kept.
    assert history.observe(103.0, Counters(calls=9, rows=None)) is None
    for t in (104.0, 105.0, 106.0):
        history.observe(t, Counters(calls=9, rows=None))
    state = history.as_dict()
    assert state["t"] == [104.0, 105.0, 106.0]
    assert state["calls_per_s"] == [4.0, 0.0, 0.0]
    assert state["rows_per_s"] == [None, None, None]


def test_io_latency_is_of_the_calls_of_each_second_per_backend() -> None:
    history = DashboardHistory()
    slow = _hist((0.001, 0), (0.1, 0), (0.2, 10))  # 10 calls between 100 and 200 ms
    history.observe(1.0, Counters(calls=0, rows=0, io={"rpc": _hist((0.001, 0))}))
    first = history.observe(2.0, Counters(calls=0, rows=0, io={"rpc": slow}))
    assert first is not None
    p50, p99, per_s = first.io["rpc"]
    assert p50 is not None and 100 < p50 < 200 and p99 == p50 and per_s == 10.0
    # Ten fast calls the next second: the percentiles are theirs, not the cumulative mix.
    fast = _hist((0.001, 10), (0.1, 10), (0.2, 20))
    second = history.observe(3.0, Counters(calls=0, rows=0, io={"rpc": fast}))
    assert second is not None
    p50, p99, per_s = second.io["rpc"]
    assert p50 is not None and p50 <= 1.0 and p99 is not None and p99 <= 1.0 and per_s == 10.0
    # A second without calls has no latency (a gap in the plot, not a zero).
    idle = history.observe(4.0, Counters(calls=0, rows=0, io={"rpc": fast}))
    assert idle is not None and idle.io["rpc"] == (None, None, 0.0)
    assert history.as_dict()["io"]["rpc"]["p50_ms"][-1] is None


def test_interval_quantile_and_per_backend_sums() -> None:
    assert interval_quantile([], [], 0.5) == (None, 0)
    after = [(0.01, 1), (0.02, 3), (math.inf, 4)]
    assert interval_quantile([], after, 0.25) == (pytest.approx(10.0), 4)
    value, count = interval_quantile([], after, 0.75)
    assert count == 4 and value == pytest.approx(math.sqrt(0.01 * 0.02) * 1000)
    assert interval_quantile([], after, 1.0)[0] == pytest.approx(20.0)  # the open bucket
    rows = [
        {"backend": "blockdb", "buckets": [(0.01, 1), (math.inf, 1)]},
        {"backend": "blockdb", "buckets": [(0.02, 2), (math.inf, 2)]},
        {"backend": "rpc", "buckets": [(math.inf, 0)]},
    ]
    assert _backend_histograms(rows) == {
        "blockdb": ((0.01, 1), (0.02, 3), (math.inf, 3)),
        "rpc": ((math.inf, 0),),
    }


def test_executor_cpu_percent_from_cpu_seconds() -> None:
    history = DashboardHistory()
    history.observe(10.0, Counters(calls=0, rows=0, cpu_seconds={"exec-0": 1.0, "exec-1": None}))
    history.observe(12.0, Counters(calls=0, rows=0, cpu_seconds={"exec-0": 2.5, "exec-1": 3.0}))
    assert history.cpu_percent == {"exec-0": pytest.approx(75.0)}


def test_the_io_adapter_reads_the_subsystem_histograms() -> None:
    from blockx.worker.io.stats import IOStats

    stats = IOStats()
    op = stats.operation("blockdb", "get_row")
    for seconds in (0.001, 0.001, 0.050):
        op.record_call(seconds, failed=False)
    stats.operation("blockdb", "get_row").record_cache_hit()

    class Subsystem:
        def __init__(self) -> None:
            self.stats = stats

    from blockx.observability.snapshot import io_snapshot

    [row] = io_snapshot(Subsystem())
    assert row["backend"] == "blockdb" and row["operation"] == "get_row"
    assert row["requests"] == 4 and row["cache_hits"] == 1 and row["failed"] == 0
    assert row["buckets"][-1] == (math.inf, 3)
    p50, count = interval_quantile([], row["buckets"], 0.5)
    assert count == 3 and p50 is not None and 0.8 < p50 < 1.25


# --- the JSON state of a real server -----------------------------------------------------------


@pytest.mark.slow
def test_the_state_endpoint_shows_tasks_history_io_and_executors(tmp_path: Path) -> None:
    with _server(tmp_path, token="dash-token") as s:
        # The page and its assets are public (no data in them); the state is not.
        for path in sorted(PUBLIC_PATHS):
            reply = s.request("GET", path, token=None)
            assert reply.status == 200, (path, reply)
        assert b"/dashboard/dashboard.js" in s.request("GET", "/", token=None).body
        assert s.request("GET", "/v1/dashboard", token=None).status == 401
        assert s.request("GET", "/v1/dashboard", token="wrong").status == 401

        empty = s.request("GET", "/v1/dashboard").json()
        assert empty["tasks"] == [] and empty["task_counts"]["running"] == 0
        task_id = s.submit(_task(300))
        assert s.wait_finished(task_id)["state"] == "succeeded"

        def settled() -> Any:
            state = s.request("GET", "/v1/dashboard").json()
            history = state["history"]
            io = history["io"].get("blockdb", {}).get("p50_ms", [])
            moved = sum(history["calls_per_s"]) > 0 and any(v is not None for v in io)
            return moved and state

        state = wait_for(settled, 60, "the history to show the task's calls and IO")
    [task] = state["tasks"]
    assert task["id"] == task_id and task["state"] == "succeeded"
    assert task["done"] == task["calls"] == task["rows"] == 300
    assert (
        task["failures_by_kind"] == {} and task["failures_url"] == f"/v1/tasks/{task_id}/failures"
    )
    assert task["calls_per_s"] > 0
    assert state["task_counts"]["succeeded"] == 1
    # calls settled per second, summed over the history, is every call once (root calls
    # only here: no sub-calls), and the history's clock moves a second at a time
    history = state["history"]
    assert (
        round(
            sum(
                history["calls_per_s"][i] * (history["t"][i] - history["t"][i - 1])
                for i in range(1, len(history["t"]))
            )
        )
        <= 300
    )
    assert {(o["backend"], o["operation"]) for o in state["io"]} >= {
        ("blockdb", "get_row"),
        ("blockdb", "upsert_rows"),
    }
    assert all("buckets" not in o for o in state["io"])
    executors = state["executors"]
    assert [e["executor"] for e in executors] == ["exec-0", "exec-1"]
    for e in executors:
        assert e["state"] == "running" and e["pid"] > 0 and e["restarts"] == 0
        assert e["rss_bytes"] > 1_000_000 and e["cpu_seconds"] > 0
        assert e["inflight"] == 0 and e["suspended"] == 0


def _failing_task() -> dict[str, Any]:
    """30 calls, 10 of which raise (``failure: continue``: the task succeeds)."""
    source = "def _(i):\n    if i % 3 == 0:\n        raise ValueError(i)\n    return i\n"
    return {
        "functions": {"f": {"source": source}},
        "calls": [{"function": "f", "args": i} for i in range(30)],
        "policy": {"failure": "continue", "max_attempts": 1},
    }


@pytest.mark.slow
def test_an_executor_killed_shows_its_restart(tmp_path: Path) -> None:
    import signal

    with _server(tmp_path) as s:

        def executors() -> dict[str, Any]:
            state = s.request("GET", "/v1/dashboard").json()
            return {e["executor"]: e for e in state["executors"]}

        before = wait_for(
            lambda: (e := executors()) and all(x["rss_bytes"] for x in e.values()) and e,
            60,
            "both executors' heartbeats",
        )
        os.kill(before["exec-1"]["pid"], signal.SIGKILL)
        after = wait_for(
            lambda: (
                (e := executors())["exec-1"]["restarts"] == 1
                and e["exec-1"]["state"] == "running"
                and e["exec-1"]["pid"] not in (None, before["exec-1"]["pid"])
                and e
            ),
            60,
            "exec-1 restarted",
        )
        assert (
            after["exec-0"]["restarts"] == 0 and after["exec-0"]["pid"] == before["exec-0"]["pid"]
        )
        assert s.request("GET", "/v1/dashboard").json()["pool"]["restarts"] == 1


@pytest.mark.slow
def test_the_newest_finished_tasks_are_listed_and_the_others_counted(tmp_path: Path) -> None:
    with _server(tmp_path) as s:
        ids = [s.submit({**_task(1), "instance": f"i{n}"}) for n in range(FINISHED_SHOWN + 2)]
        for task_id in ids:
            s.wait_finished(task_id)
        state = s.request("GET", "/v1/dashboard").json()
    assert [t["id"] for t in state["tasks"]] == ids[::-1][:FINISHED_SHOWN]
    assert state["tasks_hidden"] == 2
    assert state["task_counts"] == {
        "queued": 0,
        "running": 0,
        "succeeded": FINISHED_SHOWN + 2,
        "failed": 0,
        "cancelled": 0,
    }


@pytest.mark.slow
def test_failures_by_kind_after_a_task_ran(tmp_path: Path) -> None:
    with _server(tmp_path) as s:
        task_id = s.submit(_failing_task())
        assert s.wait_finished(task_id)["failed"] == 10
        [row] = s.request("GET", "/v1/dashboard").json()["tasks"]
    assert row["state"] == "succeeded" and row["failed"] == 10 and row["exit_code"] == 1
    assert row["failures_by_kind"] == {"user_error": 10}, row


@pytest.mark.slow
def test_progress_counts_calls_ended_before_their_batch_is_stored(tmp_path: Path) -> None:
    """30 calls in one batch, the last 10 held by a gate: the store has none of them yet,
    the dashboard's progress has the 20 that ended."""
    gate = tmp_path / "gate"
    source = (
        "import os, time\n"
        "def _(i):\n"
        "    if i >= 20:\n"
        f"        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.01)\n"
        "    return i\n"
    )
    task = {
        "functions": {"g": {"source": source}},
        "calls": [{"function": "g", "args": i} for i in range(30)],
        "policy": {"call_budget_ms": 0},
    }
    with _server(tmp_path) as s:
        task_id = s.submit(task)

        def twenty_ended() -> Any:
            [row] = s.request("GET", "/v1/dashboard").json()["tasks"]
            return row["state"] == "running" and row["unstored"] == 20 and row

        row = wait_for(twenty_ended, 60, "the 20 ended calls")
        assert row["done"] == 0 and row["rows"] == 0, row  # nothing stored yet
        assert s.status(task_id)["done"] == 0
        gate.touch()
        assert s.wait_finished(task_id)["state"] == "succeeded"
        [row] = s.request("GET", "/v1/dashboard").json()["tasks"]
    assert row["done"] == 30 and row["unstored"] == 0, row


@pytest.mark.slow
def test_failures_by_kind_while_a_task_runs(tmp_path: Path) -> None:
    """A running task's failures are counted from its stored failure records."""
    gate = tmp_path / "gate"
    source = (
        "import os, time\n"
        "def _(i):\n"
        "    if i < 10:\n"
        "        raise ValueError(i)\n"
        "    if i >= 20:\n"
        f"        while not os.path.exists({str(gate)!r}):\n"
        "            time.sleep(0.01)\n"
        "    return i\n"
    )
    task = {
        "functions": {"g": {"source": source}},
        "calls": [{"function": "g", "args": i} for i in range(30)],
        "policy": {"failure": "continue", "max_attempts": 1, "call_budget_ms": 0},
    }
    with _server(tmp_path, "--set", "stream_build.batch_max_rows=10") as s:
        task_id = s.submit(task)

        def running_with_failures() -> Any:
            [row] = s.request("GET", "/v1/dashboard").json()["tasks"]
            return row["state"] == "running" and row["failed"] == 10 and row

        row = wait_for(running_with_failures, 60, "the running task's stored failures")
        assert row["failures_by_kind"] == {"user_error": 10}, row
        gate.touch()
        assert s.wait_finished(task_id)["state"] == "succeeded"


# --- in a real browser ----------------------------------------------------------------------


def _chrome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Debian's chromium through Debian's chromedriver, headless; skips when missing."""
    if not (os.access(CHROMIUM, os.X_OK) or shutil.which("chromium")):
        pytest.skip(f"no chromium ({CHROMIUM}): scripts/install-system-deps.sh installs it")
    if not os.access(CHROMEDRIVER, os.X_OK):
        pytest.skip(
            f"no chromedriver ({CHROMEDRIVER}): scripts/install-system-deps.sh installs "
            "Debian's chromium-driver"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra)")
    # Never let selenium-manager fetch a browser or a driver.
    monkeypatch.setenv("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,1300",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    try:
        return webdriver.Chrome(options=options, service=service)
    except Exception as exc:  # e.g. a chromium and a chromedriver of different versions
        pytest.skip(f"chromium did not start through chromedriver: {exc}")


@pytest.mark.slow
def test_the_dashboard_in_a_real_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from selenium.webdriver.common.by import By

    driver = _chrome(tmp_path, monkeypatch)
    screenshot = tmp_path / "dashboard.png"
    try:
        with _server(tmp_path, token="browser-token") as s:
            # The token travels once in the address, then lives in sessionStorage.
            driver.get(f"{s.url}/?token=browser-token")
            assert "token=" not in driver.current_url
            wait_for(
                lambda: driver.find_elements(By.CSS_SELECTOR, "#tasks-empty:not(.hidden)"),
                60,
                "the empty state of the task table",
            )
            assert "No tasks yet" in driver.find_element(By.ID, "tasks-empty").text
            task_id = s.submit(_task(400))

            def succeeded_row() -> Any:
                page = _page(driver)
                row = page["tasks"].get(task_id)
                return row is not None and row["state"] == "succeeded" and page

            wait_for(succeeded_row, 120, "the task to show as succeeded")

            def plots_drawn() -> Any:
                page = _page(driver)
                drawn = (
                    "blockdb" in page["io_backends"]
                    and not page["io_empty_shown"]
                    and "calls/s" in page["throughput_legend"]
                    and all("%" in e["cells"][4] for e in page["executors"])
                )
                return drawn and page

            page = wait_for(plots_drawn, 60, "both plots and the executors' CPU to have data")
            driver.save_screenshot(str(screenshot))

            row = page["tasks"][task_id]
            assert row["cells"]["state"] == "succeeded", row
            assert "400 / 400" in row["text"] and "100%" in row["text"], row
            assert row["cells"]["rows"] == "400" and row["cells"]["failures"] == "—", row
            assert page["throughput_canvases"] and page["io_canvases"], page
            assert "blockdb p50" in page["io_legend"] and "blockdb p99" in page["io_legend"]
            assert [e["executor"] for e in page["executors"]] == ["exec-0", "exec-1"], page
            for e in page["executors"]:
                cells = e["cells"]
                assert cells[1] == "running", cells
                assert cells[3].endswith(" MB") and cells[4].endswith(" %"), cells
            assert "live" in page["connection"], page
            assert "1 succeeded" in page["summary"], page
            # No script error, no resource refused (the page's CSP), nothing missing.
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
    finally:
        driver.quit()
    print(f"dashboard screenshot: {screenshot}")
    assert screenshot.stat().st_size > 10_000


#: One reading of what the page shows, taken in the page at once (it redraws its tables
#: every second: element handles held across a redraw would go stale).
_READ_PAGE = """
const text = (el) => el ? el.textContent.replace(/\\s+/g, " ").trim() : "";
const tasks = {};
for (const tr of document.querySelectorAll("#tasks tbody tr")) {
  const cell = (c) => text(tr.querySelector("td." + c));
  tasks[tr.dataset.taskId] = {
    state: tr.dataset.state, text: text(tr),
    cells: {state: cell("state"), rows: cell("rows"), failures: cell("failures")},
  };
}
return {
  tasks,
  executors: [...document.querySelectorAll("#executors tbody tr")].map((tr) => ({
    executor: tr.dataset.executor,
    cells: [...tr.querySelectorAll("td")].map(text),
  })),
  io_backends: document.getElementById("plot-io").dataset.backends || "",
  io_empty_shown: !document.getElementById("io-empty").classList.contains("hidden"),
  io_legend: text(document.querySelector("#plot-io .u-legend")),
  io_canvases: document.querySelectorAll("#plot-io .uplot canvas").length,
  throughput_legend: text(document.querySelector("#plot-throughput .u-legend")),
  throughput_canvases: document.querySelectorAll("#plot-throughput .uplot canvas").length,
  connection: text(document.getElementById("conn-text")),
  summary: text(document.getElementById("summary")),
};
"""


def _page(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(_READ_PAGE))


@pytest.mark.slow
def test_the_page_asks_for_the_token_when_it_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.common.by import By

    driver = _chrome(tmp_path, monkeypatch)
    try:
        with _server(tmp_path, token="form-token") as s:
            driver.get(s.url + "/")
            wait_for(
                lambda: driver.find_elements(By.CSS_SELECTOR, "#login:not(.hidden)"),
                60,
                "the token form",
            )
            driver.find_element(By.ID, "login-token").send_keys("form-token")
            driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
            wait_for(
                lambda: driver.find_elements(By.CSS_SELECTOR, "#executors tbody tr"),
                60,
                "the executor table after the token was given",
            )
            assert "hidden" in (driver.find_element(By.ID, "login").get_attribute("class") or "")
            # A task with failed calls: its failure kinds, and the report link opens the
            # failure records (fetched with the token) in a new tab.
            task_id = s.submit(_failing_task())
            assert s.wait_finished(task_id)["failed"] == 10
            wait_for(
                lambda: "user_error ×10" in _page(driver)["tasks"].get(task_id, {}).get("text", ""),
                60,
                "the failures by kind",
            )
            assert _page(driver)["tasks"][task_id]["cells"]["state"] == "succeeded"
            first = driver.current_window_handle
            driver.execute_script(
                "document.querySelector(arguments[0]).click()",
                f'#tasks tr[data-task-id="{task_id}"] a.report',
            )
            wait_for(lambda: len(driver.window_handles) == 2, 30, "the report's tab")
            driver.switch_to.window(next(h for h in driver.window_handles if h != first))
            report = wait_for(
                lambda: driver.find_element(By.TAG_NAME, "body").text.strip(), 30, "the report"
            )
            records = [json.loads(line) for line in report.splitlines()]
            assert len(records) == 10 and {r["kind"] for r in records} == {"user_error"}, records
    finally:
        driver.quit()
