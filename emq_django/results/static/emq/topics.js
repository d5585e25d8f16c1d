// The emq Topics page: polls the admin's topics data view every 2 s and redraws in place.
// Plain DOM, no libraries (the page must work with no internet).
(function () {
  "use strict";
  var root = document.getElementById("emq-topics");
  if (!root) return;
  var url = root.dataset.url;
  var topic = root.dataset.topic || "";
  var pollMs = parseInt(root.dataset.pollMs, 10) || 2000;

  function $(id) { return document.getElementById(id); }
  function text(id, value) { $(id).textContent = value; }
  function fmt(n, digits) {
    if (n === null || n === undefined) return "–";
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
  }

  // cells: strings/numbers, or {node: Element}
  function fillTable(id, rows, empty) {
    var table = $(id), frag = document.createDocumentFragment();
    rows.forEach(function (cells) {
      var tr = document.createElement("tr");
      cells.forEach(function (cell) {
        var td = document.createElement("td");
        if (cell && cell.node) { td.appendChild(cell.node); if (cell.cls) td.className = cell.cls; }
        else {
          if (typeof cell === "number") td.className = "emq-num";
          td.textContent = cell === null || cell === undefined ? "–" : String(cell);
        }
        tr.appendChild(td);
      });
      frag.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = table.tHead.rows[0].cells.length;
      td.textContent = empty || "none";
      tr.appendChild(td);
      frag.appendChild(tr);
    }
    table.tBodies[0].replaceChildren(frag);
  }

  function topicLink(name) {
    var a = document.createElement("a");
    a.href = "?topic=" + encodeURIComponent(name);
    a.textContent = name;
    a.className = "emq-topic-link";
    if (name === topic) a.style.fontWeight = "bold";
    return { node: a };
  }

  function dataCell(e) {
    var pre = document.createElement("pre");
    pre.className = "emq-pre emq-event-data";
    pre.textContent = e.text + (e.note ? "\n(" + e.note + ")" : "");
    pre.title = "shown as " + e.as;
    return { node: pre };
  }

  function render(d) {
    text("emq-updated", new Date(d.time * 1000).toLocaleTimeString());
    if (!d.ok) {
      text("emq-unreachable-address", d.address);
      var detail = d.error || "", prefix = "broker unreachable at " + d.address + ": ";
      if (detail.indexOf(prefix) === 0) detail = detail.slice(prefix.length);
      text("emq-unreachable-detail", detail);
      $("emq-unreachable").hidden = false;
      document.querySelectorAll(".emq-table, .emq-cards").forEach(function (el) { el.classList.add("emq-stale"); });
      $("emq-state").textContent = "unreachable";
      $("emq-state").className = "emq-value emq-down";
      return;
    }
    $("emq-unreachable").hidden = true;
    document.querySelectorAll(".emq-stale").forEach(function (el) { el.classList.remove("emq-stale"); });
    $("emq-state").textContent = "up";
    $("emq-state").className = "emq-value emq-up";
    $("emq-topics-off").hidden = d.available !== false;
    var rate = 0, subs = 0;
    d.topics.forEach(function (t) { rate += t.events_per_s || 0; });
    d.ports.forEach(function (p) { subs += p.subscribers || 0; });
    text("emq-topic-count", fmt(d.topics.length));
    text("emq-last-seq", fmt(d.last_seq));
    text("emq-events-rate", fmt(rate, 1));
    text("emq-subscribers", fmt(subs));
    fillTable("emq-topic-table", d.topics.map(function (t) {
      return [topicLink(t.topic), t.last_seq, t.events, t.events_per_s === null || t.events_per_s === undefined ? null : Number(t.events_per_s.toFixed(1))];
    }), "no topic has events yet");
    fillTable("emq-port-table", d.ports.map(function (p) { return [p.port, p.subscribers]; }));
    if (d.latest) {
      var err = $("emq-latest-error");
      err.style.display = d.latest.error ? "" : "none";
      err.textContent = d.latest.error || "";
      fillTable("emq-latest", d.latest.events.slice().reverse().map(function (e) {
        return [e.seq, e.ts ? new Date(e.ts * 1000).toLocaleTimeString() : null, e.producer, e.content_type || e.as, e.size, dataCell(e)];
      }), "no events kept for this topic");
    }
  }

  function poll() {
    var started = Date.now();
    var q = topic ? "?topic=" + encodeURIComponent(topic) : "";
    fetch(url + q, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("the topics view answered HTTP " + r.status);
        return r.json();
      })
      .then(render)
      .catch(function (err) {
        render({ ok: false, address: root.dataset.address, time: Date.now() / 1000,
                 error: "the web server did not answer: " + err.message });
      })
      .finally(function () { setTimeout(poll, Math.max(0, pollMs - (Date.now() - started))); });
  }
  poll();
})();
