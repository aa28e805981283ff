// BlockX serve dashboard: plain JavaScript, no build step.
//
// Polls GET /v1/dashboard once a second (fetch can send the bearer token; EventSource
// cannot) and renders the tasks, two uPlot charts and the executors. The token, when the
// server has one, comes from /?token=... once (then the address bar is cleaned) or from
// the form shown on a 401; it is kept in sessionStorage (this tab only).
"use strict";

(function () {
  const POLL_MS = 1000;
  const TOKEN_KEY = "blockx.dashboard.token";
  const PALETTE = ["#2f6fde", "#d98b0b", "#1f9d55", "#9b59b6", "#d64545", "#17a2b8"];

  // --- the token ------------------------------------------------------------------------
  (function takeTokenFromUrl() {
    const url = new URL(window.location.href);
    const token = url.searchParams.get("token");
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
      url.searchParams.delete("token");
      history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  })();

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: "Bearer " + token } : {};
  }

  const $ = (id) => document.getElementById(id);

  function showLogin(message) {
    $("login").classList.remove("hidden");
    $("main").classList.add("hidden");
    $("login-error").textContent = message || "";
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("login-token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("login").classList.add("hidden");
    $("main").classList.remove("hidden");
    poll();
  });

  // --- formatting -----------------------------------------------------------------------
  const nf = new Intl.NumberFormat("en-US");
  function int(n) { return n == null ? "—" : nf.format(n); }
  function rate(n) {
    if (n == null) return "—";
    if (n === 0) return "0";
    if (n >= 100) return nf.format(Math.round(n));
    return n.toFixed(1);
  }
  function mb(bytes) {
    if (bytes == null) return "—";
    return (bytes / (1024 * 1024)).toFixed(1) + " MB";
  }
  function pct(p) { return p == null ? "—" : p.toFixed(p >= 10 ? 0 : 1) + " %"; }
  function duration(s) {
    if (s == null || s < 0) return "—";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min " + Math.floor(s % 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    for (const child of children) {
      if (child == null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function none() { return el("span", { class: "none" }, "—"); }

  // A table is redrawn every second; not while the reader is selecting text in it
  // (to copy a task id, say): the redraw would drop the selection.
  function selecting(table) {
    const sel = window.getSelection();
    return !!(sel && !sel.isCollapsed && sel.anchorNode && table.contains(sel.anchorNode));
  }

  // --- tasks ----------------------------------------------------------------------------
  function progressCell(t) {
    const total = Math.max(t.calls, 1);
    const bar = el("div", { class: "bar " + t.state, role: "progressbar",
      "aria-valuemin": "0", "aria-valuemax": String(t.calls), "aria-valuenow": String(t.done + (t.unstored || 0)) });
    const ok = t.succeeded, bad = t.failed, cut = t.cancelled, pending = t.unstored || 0;
    const ended = t.done + pending;
    // Widths through the CSSOM, not style attributes (the page's CSP allows no inline style).
    for (const [cls, n] of [["ok", ok], ["bad", bad], ["cut", cut], ["pending", pending]]) {
      if (!n) continue;
      const part = el("span", { class: cls });
      part.style.width = `${(100 * n) / total}%`;
      bar.append(part);
    }
    const open = t.streamed && !t.closed ? " (open)" : "";
    const percent = t.calls ? Math.floor((100 * ended) / t.calls) + "%" : "";
    const num = el("span", { class: "num" }, `${int(ended)} / ${int(t.calls)}${open}`,
      percent ? el("span", { class: "muted" }, " · " + percent) : null);
    const title = `${int(ended)} calls ended, ${int(t.done)} stored (${int(t.succeeded)} succeeded, ` +
      `${int(t.failed)} failed, ${int(t.cancelled)} cancelled): the server stores a settled batch at a time`;
    return el("div", { class: "progress", title }, bar, num);
  }

  function failuresCell(t) {
    const kinds = Object.entries(t.failures_by_kind || {}).sort((a, b) => b[1] - a[1]);
    if (!kinds.length) return none();
    const cell = el("span");
    for (const [kind, n] of kinds) cell.append(el("span", { class: "kind", title: kind }, `${kind} ×${int(n)}`));
    const link = el("a", { class: "report", href: t.failures_url, target: "_blank", rel: "noopener" }, "report ↗");
    link.addEventListener("click", openWithToken);
    cell.append(link);
    return cell;
  }

  // A link to an API route: with a token, fetch it with the header and show it in a new tab.
  async function openWithToken(event) {
    const headers = authHeaders();
    if (!headers.Authorization) return;
    event.preventDefault();
    const tab = window.open("", "_blank");
    const response = await fetch(event.currentTarget.href, { headers });
    const blob = new Blob([await response.text()], { type: "text/plain;charset=utf-8" });
    const href = URL.createObjectURL(blob);
    if (tab) tab.location.href = href; else window.location.href = href;
  }

  function timeCell(t, now) {
    if (t.state === "queued") return el("span", { class: "muted", title: "waiting since" }, duration(now - t.created_at));
    if (t.started_at == null) return none();
    const end = t.ended_at != null ? t.ended_at : now;
    return el("span", { title: t.ended_at != null ? "ran for" : "running for" }, duration(end - t.started_at));
  }

  function renderTasks(state) {
    const body = $("tasks").querySelector("tbody");
    const frozen = selecting($("tasks"));
    if (!frozen) body.replaceChildren();
    for (const t of frozen ? [] : state.tasks) {
      const partial = t.state === "succeeded" && t.failed > 0;
      const stateCell = el("span", { class: "pill " + t.state + (partial ? " partial" : ""),
        title: partial ? `succeeded under failure: continue, ${t.failed} calls failed (exit code 1)` : t.state },
        t.state);
      const task = el("td", { class: "l" },
        el("span", { class: "id", title: t.id }, t.id),
        el("span", { class: "sub", title: t.task_id }, t.task_id));
      body.append(el("tr", { "data-task-id": t.id, "data-state": t.state },
        task,
        el("td", { class: "l" }, t.instance ? el("span", { class: "sub instance", title: t.instance }, t.instance) : none()),
        el("td", { class: "l state" }, stateCell),
        el("td", { class: "l" }, progressCell(t)),
        el("td", { class: "r rate" }, rate(t.calls_per_s)),
        el("td", { class: "r rows" }, int(t.rows)),
        el("td", { class: "l failures" }, failuresCell(t)),
        el("td", { class: "r" }, timeCell(t, state.now))));
    }
    $("tasks-empty").classList.toggle("hidden", state.tasks.length > 0);
    $("tasks").classList.toggle("hidden", state.tasks.length === 0);
    const s = state.server;
    let note = `${s.running} of ${s.slots} run slots in use`;
    if (s.waiting) note += ` · ${s.waiting} waiting`;
    if (state.tasks_hidden) note += ` · ${state.tasks_hidden} older finished tasks not shown`;
    if (s.draining) note += " · draining";
    $("tasks-note").textContent = note;
    const c = state.task_counts;
    for (const k of ["running", "queued", "succeeded", "failed"]) {
      $("chip-" + k).querySelector("b").textContent = int(c[k] || 0);
    }
    $("chip-failed").classList.toggle("nonzero", (c.failed || 0) > 0);
    const h = state.history.calls_per_s;
    $("chip-rate").querySelector("b").textContent = rate(h.length ? h[h.length - 1] : 0);
  }

  // --- executors ------------------------------------------------------------------------
  function renderExecutors(state) {
    const body = $("executors").querySelector("tbody");
    const frozen = selecting($("executors"));
    if (!frozen) body.replaceChildren();
    for (const e of frozen ? [] : state.executors) {
      const age = e.heartbeat_age_s;
      const stale = age != null && age > 5;
      body.append(el("tr", { "data-executor": e.executor, "data-state": e.state },
        el("td", { class: "l id" }, e.executor),
        el("td", { class: "l state" }, el("span", { class: "pill " + e.state }, e.state)),
        el("td", { class: "r" }, e.pid == null ? none() : String(e.pid)),
        el("td", { class: "r rss" }, e.rss_bytes == null ? none() : mb(e.rss_bytes)),
        el("td", { class: "r cpu" }, e.cpu_percent == null ? none() : pct(e.cpu_percent)),
        el("td", { class: "r" }, int(e.inflight)),
        el("td", { class: "r" }, int(e.suspended)),
        el("td", { class: "r" }, e.restarts ? el("span", { class: "pill warn" }, int(e.restarts)) : "0"),
        el("td", { class: "r" }, age == null ? none()
          : el("span", { class: stale ? "pill failed" : "muted" }, age < 1 ? "< 1 s ago" : age.toFixed(0) + " s ago"))));
    }
    const n = state.executors.length;
    $("executors-empty").classList.toggle("hidden", n > 0);
    $("executors").classList.toggle("hidden", n === 0);
    const running = state.executors.filter((e) => e.state === "running").length;
    $("executors-note").textContent = n ? `${running} of ${n} running · CPU 100 % = one core` : "";
  }

  // --- charts ---------------------------------------------------------------------------
  let throughputChart = null;
  let ioChart = null;
  let ioBackends = "";

  function plotWidth(id) { return Math.max(300, $(id).clientWidth); }

  // Local wall-clock time, 24 h: the axis needs no date (it spans 5 minutes at most).
  function clock(seconds) {
    return new Date(seconds * 1000).toLocaleTimeString("en-GB", { hour12: false });
  }

  function axisValue(v, unit) {
    if (v == null) return "";
    if (unit === "ms") {
      if (v >= 1000) return +(v / 1000).toPrecision(3) + " s";
      return +v.toPrecision(3) + " ms";
    }
    return v >= 1000 ? nf.format(v) : String(+v.toPrecision(3));
  }

  function axes(unit) {
    return [
      { stroke: "#6b7385", grid: { stroke: "#eef1f6" }, ticks: { stroke: "#e3e7ee" },
        values: (u, splits) => splits.map((v) => v == null ? "" : clock(v)) },
      { stroke: "#6b7385", grid: { stroke: "#eef1f6" }, ticks: { stroke: "#e3e7ee" }, size: 72,
        values: (u, splits) => splits.map((v) => axisValue(v, unit)) },
    ];
  }

  // The x axis: the last minute at least, growing to the 5 minutes the server keeps.
  function xRange(u, min, max) {
    const t = u.data[0];
    const last = t.length ? t[t.length - 1] : Date.now() / 1000;
    const first = t.length ? t[0] : last;
    return [last - Math.max(60, last - first), last];
  }

  function emptyTimes(history) {
    if (history.t.length) return history.t;
    const now = Date.now() / 1000;
    return [now - 60, now];
  }

  function renderThroughput(history) {
    const t = emptyTimes(history);
    const calls = history.t.length ? history.calls_per_s : t.map(() => null);
    const data = [t, calls];
    if (!throughputChart) {
      throughputChart = new uPlot({
        width: plotWidth("plot-throughput"), height: 240,
        scales: { x: { time: true, range: xRange }, y: { range: (u, min, max) => [0, Math.max(5, (max || 0) * 1.15)] } },
        axes: axes(""),
        legend: { live: false },
        series: [
          {},
          { label: "calls/s", stroke: "#2f6fde", width: 2, fill: "rgba(47,111,222,0.10)",
            value: (u, v) => v == null ? "—" : rate(v) },
        ],
      }, data, $("plot-throughput"));
    } else {
      throughputChart.setData(data);
    }
  }

  function renderIO(history) {
    const backends = Object.keys(history.io).sort();
    const key = backends.join(",");
    const t = emptyTimes(history);
    const data = [t];
    for (const b of backends) data.push(history.io[b].p50_ms, history.io[b].p99_ms);
    if (!backends.length) data.push(t.map(() => null));
    if (!ioChart || key !== ioBackends) {
      if (ioChart) ioChart.destroy();
      $("plot-io").replaceChildren();
      const series = [{}];
      backends.forEach((b, i) => {
        const colour = PALETTE[i % PALETTE.length];
        const fmt = (u, v) => v == null ? "—" : (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms";
        // Points too: a second with IO between idle ones is a lone point, not a line.
        series.push({ label: b + " p50", stroke: colour, width: 2, value: fmt,
          points: { show: true, size: 3.5, fill: colour } });
        series.push({ label: b + " p99", stroke: colour, width: 1.5, dash: [6, 4], value: fmt });
      });
      if (!backends.length) series.push({ label: "no IO", stroke: "#b5bccb", show: true });
      ioChart = new uPlot({
        width: plotWidth("plot-io"), height: 240,
        scales: { x: { time: true, range: xRange }, y: { distr: 3, log: 10 } },
        axes: axes("ms"),
        legend: { live: false, show: backends.length > 0 },
        series,
      }, data, $("plot-io"));
      ioBackends = key;
    } else {
      ioChart.setData(data);
    }
    const anyPoint = backends.some((b) => history.io[b].p50_ms.some((v) => v != null));
    $("io-empty").classList.toggle("hidden", anyPoint);
    $("plot-io").dataset.backends = key;
  }

  window.addEventListener("resize", () => {
    if (throughputChart) throughputChart.setSize({ width: plotWidth("plot-throughput"), height: 240 });
    if (ioChart) ioChart.setSize({ width: plotWidth("plot-io"), height: 240 });
  });

  // --- polling --------------------------------------------------------------------------
  function connection(ok, text) {
    const conn = $("conn");
    conn.classList.toggle("live", ok);
    conn.classList.toggle("down", !ok);
    $("conn-text").textContent = text;
  }

  let timer = null;
  async function poll() {
    clearTimeout(timer);
    try {
      const response = await fetch("/v1/dashboard", { headers: authHeaders(), cache: "no-store" });
      if (response.status === 401) {
        const had = !!sessionStorage.getItem(TOKEN_KEY);
        sessionStorage.removeItem(TOKEN_KEY);
        connection(false, "token needed");
        showLogin(had ? "That token is not the server's." : "");
        return;  // the form restarts polling
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      const state = await response.json();
      renderTasks(state);
      renderExecutors(state);
      renderThroughput(state.history);
      renderIO(state.history);
      document.body.dataset.updated = String(state.now);
      connection(true, state.server.draining ? "live · draining" : "live");
    } catch (err) {
      connection(false, "reconnecting… (" + (err && err.message ? err.message : err) + ")");
    }
    timer = setTimeout(poll, POLL_MS);
  }
  poll();
})();
