// The emq dashboard: polls the admin's data view every 2 s and redraws in place.
// Plain DOM and SVG, no libraries (the page must work with no internet).
(function () {
  "use strict";
  var root = document.getElementById("emq-dashboard");
  if (!root) return;
  var url = root.dataset.url;
  var pollMs = parseInt(root.dataset.pollMs, 10) || 2000;
  var last = null; // {t, done} of the previous answer, for the live rate
  var shown = false; // the cards show a broker's figures (kept while it is unreachable)
  var SVG = "http://www.w3.org/2000/svg";

  function $(id) { return document.getElementById(id); }
  function text(id, value) { $(id).textContent = value; }
  function fmt(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString(); }
  // the journal's jobs that wait (not the finished ones it keeps to de-duplicate)
  function journalJobs(j) {
    if (j.waiting === undefined) return j.jobs === null ? "" : ", " + fmt(j.jobs) + " job" + (j.jobs === 1 ? "" : "s");
    return ", " + fmt(j.waiting) + " waiting" + (j.done ? ", " + fmt(j.done) + " done (kept to de-duplicate)" : "");
  }
  function ago(ts, now) {
    if (ts === null || ts === undefined) return "–";
    var s = Math.max(0, now - ts);
    return s < 60 ? s.toFixed(1) + " s ago" : Math.round(s / 60) + " min ago";
  }

  function fillTable(id, rows) {
    var body = $(id).tBodies[0];
    var frag = document.createDocumentFragment();
    rows.forEach(function (cells) {
      var tr = document.createElement("tr");
      cells.forEach(function (cell) {
        var td = document.createElement("td");
        if (typeof cell === "number") td.className = "emq-num";
        if (cell && typeof cell === "object" && cell.href) {  // a link to a live page
          var a = document.createElement("a");
          a.href = cell.href;
          a.textContent = cell.text;
          td.appendChild(a);
        } else {
          td.textContent = cell === null || cell === undefined ? "–" : String(cell);
        }
        tr.appendChild(td);
      });
      frag.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = $(id).tHead.rows[0].cells.length;
      td.textContent = "none";
      tr.appendChild(td);
      frag.appendChild(tr);
    }
    body.replaceChildren(frag);
  }

  // 0 up to at least max in round steps (1, 2, 2.5 or 5 x 10^k): 0, 1, 2, 3, 4, never 3.63
  function niceTicks(max, most) {
    if (!(max > 0)) return { ticks: [0, 0.5, 1], step: 0.5 };
    var raw = max / most, power = Math.pow(10, Math.floor(Math.log10(raw))), step = power * 10;
    [1, 2, 2.5, 5, 10].some(function (m) { if (m * power >= raw) { step = m * power; return true; } return false; });
    var ticks = [];
    for (var i = 0; i <= Math.ceil(max / step - 1e-9); i++) ticks.push(i * step);
    return { ticks: ticks, step: step };
  }
  function tickLabel(v, step) {
    var decimals = 0;
    while (decimals < 6 && Math.abs(Math.round(step * Math.pow(10, decimals)) - step * Math.pow(10, decimals)) > 1e-9) decimals++;
    if (v >= 10000 && decimals === 0) return (v / 1000).toLocaleString(undefined, { maximumFractionDigits: 1 }) + "k";
    return v.toLocaleString(undefined, { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
  }

  function drawChart(svg, from, to, lines) {
    // the viewBox is the drawn size, so that text is not stretched with the chart
    var W = Math.max(300, Math.round(svg.getBoundingClientRect().width)) || 600, H = 180, top = 8, bottom = 16, left = 40;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var max = 0;
    lines.forEach(function (l) { l.points.forEach(function (p) { if (p[1] > max) max = p[1]; }); });
    var axis = niceTicks(max, 4);
    max = axis.ticks[axis.ticks.length - 1];
    function x(t) { return left + (W - left - 4) * (t - from) / Math.max(1, to - from); }
    function y(v) { return top + (H - top - bottom) * (1 - v / max); }
    var nodes = [];
    axis.ticks.forEach(function (v) {
      var g = document.createElementNS(SVG, "line");
      g.setAttribute("x1", left); g.setAttribute("x2", W); g.setAttribute("y1", y(v)); g.setAttribute("y2", y(v));
      g.setAttribute("stroke", "#ccc"); g.setAttribute("stroke-width", "0.5");
      nodes.push(g);
      var label = document.createElementNS(SVG, "text");
      label.setAttribute("x", left - 4); label.setAttribute("y", y(v) + 3);
      label.setAttribute("text-anchor", "end");
      label.setAttribute("class", "emq-ytick");
      label.textContent = tickLabel(v, axis.step);
      nodes.push(label);
    });
    ["-60 min", "-30 min", "now"].forEach(function (name, i) {
      var label = document.createElementNS(SVG, "text");
      label.setAttribute("x", left + (W - left - 4) * i / 2);
      label.setAttribute("text-anchor", ["start", "middle", "end"][i]);
      label.setAttribute("y", H - 3);
      label.textContent = name;
      nodes.push(label);
    });
    lines.forEach(function (l) {
      var pl = document.createElementNS(SVG, "polyline");
      pl.setAttribute("fill", "none");
      pl.setAttribute("stroke", l.color);
      pl.setAttribute("stroke-width", "1.5");
      pl.setAttribute("vector-effect", "non-scaling-stroke");
      pl.setAttribute("points", l.points.map(function (p) { return x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1); }).join(" "));
      nodes.push(pl);
    });
    svg.replaceChildren.apply(svg, nodes);
  }

  function drawSeries(series) {
    if (!series) return;
    var pts = series.points, w = series.bucket_seconds;
    // buckets with no finished job are zeros, not gaps, in the throughput chart
    var ok = [], bad = [], mean = [], mx = [], byT = {};
    pts.forEach(function (p) { byT[p[0]] = p; });
    for (var t = Math.ceil(series.from / w) * w; t <= series.to; t += w) {
      var p = byT[t];
      ok.push([t, p ? p[1] : 0]);
      bad.push([t, p ? p[2] : 0]);
      if (p && p[3] !== null) { mean.push([t, p[3]]); mx.push([t, p[4]]); }
    }
    drawChart($("emq-chart-throughput"), series.from, series.to, [
      { color: "#417690", points: ok }, { color: "#ba2121", points: bad }]);
    drawChart($("emq-chart-latency"), series.from, series.to, [
      { color: "#79aec8", points: mean }, { color: "#e0a030", points: mx }]);
  }

  function render(d) {
    var down = $("emq-unreachable");
    text("emq-updated", new Date(d.time * 1000).toLocaleTimeString());
    drawSeries(d.series);
    text("emq-history-note", d.history === true ? "" : (d.history || ""));
    if (!d.ok) {
      text("emq-unreachable-address", d.address);
      var detail = d.error || "", prefix = "broker unreachable at " + d.address + ": ";
      if (detail.indexOf(prefix) === 0) detail = detail.slice(prefix.length);
      text("emq-unreachable-detail", detail);
      down.hidden = false;
      document.querySelectorAll(".emq-table, .emq-cards").forEach(function (el) { el.classList.add("emq-stale"); });
      // the last figures seen: this page's, else the web server's (after a reload)
      if (!shown && d.last) {
        renderBroker(d.last.monitor, d.last, d.queue_rates);
        text("emq-seen", "at " + new Date(d.last.time * 1000).toLocaleTimeString());
      }
      $("emq-state").textContent = "unreachable";
      $("emq-state").className = "emq-value emq-down";
      last = null;
      return;
    }
    down.hidden = true;
    text("emq-seen", "");
    document.querySelectorAll(".emq-stale").forEach(function (el) { el.classList.remove("emq-stale"); });
    renderBroker(d.monitor, d, d.queue_rates);
    shown = true;
    $("emq-state").textContent = d.monitor.broker.stopping ? "stopping" : "up";
    $("emq-state").className = "emq-value emq-up";
  }

  function renderBroker(m, d, queueRates) {
    var c = m.counters || {}, now = m.broker.time || d.time;
    var done = (c.succeeded || 0) + (c.failed || 0);
    if (last && now > last.t) {
      text("emq-rate", ((done - last.done) / (now - last.t)).toFixed(1));
    } else if (queueRates && Object.keys(queueRates).length) {
      // no earlier answer to compare with (first poll, or a page opened while the
      // broker is down): the last minute's rate from the job history
      var sum = Object.keys(queueRates).reduce(function (s, k) { return s + queueRates[k]; }, 0);
      text("emq-rate", sum.toFixed(1));
    }
    last = { t: now, done: done };
    text("emq-succeeded", fmt(c.succeeded));
    text("emq-failed", fmt(c.failed));
    text("emq-inflight", fmt(m.in_flight));
    text("emq-dead", d.dead_letters === null || d.dead_letters === undefined ? "n/a" : fmt(d.dead_letters));
    text("emq-journal", d.journal ? (d.journal.size_bytes === null ? "?" : (d.journal.size_bytes / 1024).toFixed(0) + " KiB")
      + journalJobs(d.journal) : "n/a");
    text("emq-broker", "pid " + m.broker.pid + " · up " + Math.round(m.broker.uptime) + " s · " + d.address);
    renderHa(m.ha, now);
    var rates = queueRates || {};
    fillTable("emq-queues", m.queues.map(function (q) {
      return [{text: q.name + (q.paused ? " (paused)" : ""), href: "queue/" + encodeURIComponent(q.name) + "/"}, q.depth, q.in_flight, rates[q.name] === undefined ? 0 : rates[q.name],
        q.job_managers.map(function (j) { return j.identity + " (w" + j.weight + ", " + j.free_slots + " free)"; }).join(", ")];
    }));
    fillTable("emq-jobmanagers", m.job_managers.map(function (j) {
      return [{text: j.identity + (j.draining ? " (stopping)" : ""), href: "jobmanager/" + encodeURIComponent(j.identity) + "/"}, j.host, j.pid,
        (j.queues || []).map(function (q) { return q[1] + ":" + q[0]; }).join(", "),
        j.busy, j.free_slots, j.slots, j.jobs_done, fmt(j.jobs_failed), memory(j), ago(j.last_heartbeat, now)];
    }));
    fillTable("emq-schedulers", (m.schedulers || []).map(function (s) {
      return [s.identity, s.host, s.pid, ago(s.last_heartbeat, now)];
    }));
  }

  // a job manager's resident memory, its processes' included (our job manager
  // reports it every 5 s; EventMQ's reports none)
  function memory(j) {
    if (j.memory_bytes === null || j.memory_bytes === undefined) return "not reported";
    return (j.memory_bytes / 1048576).toFixed(1) + " MiB";
  }

  // the lease (EMQ_JOURNAL_URL): the answering broker's role, the epoch, the
  // last failover and every broker sharing the journal
  function renderHa(ha, now) {
    $("emq-ha-card").hidden = !ha;
    $("emq-ha-section").hidden = !ha;
    if (!ha) return;
    text("emq-ha", ha.role + " · epoch " + ha.epoch + " · active " + (ha.active || "none"));
    var f = ha.last_failover;
    text("emq-ha-failover", f ? "Last failover: " + f.from + " → " + f.to + ", " + ago(f.at, now)
      + (f.took_s === null || f.took_s === undefined ? "" : ", took " + f.took_s.toFixed(3) + " s")
      : "No failover yet.");
    fillTable("emq-brokers", (ha.brokers || []).map(function (b) {
      var info = b.info || {};
      return [b.name, b.role, info.host, info.pid, info.frontend, info.monitor,
        b.seen_ago === undefined ? "–" : b.seen_ago.toFixed(1) + " s ago"];
    }));
  }

  function poll() {
    var started = Date.now();
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("the dashboard view answered HTTP " + r.status);
        return r.json();
      })
      .then(render)
      .catch(function (err) {
        render({ ok: false, address: root.dataset.address, time: Date.now() / 1000,
                 error: "the web server did not answer: " + err.message, history: "" });
      })
      .finally(function () { setTimeout(poll, Math.max(0, pollMs - (Date.now() - started))); });
  }
  poll();
})();
