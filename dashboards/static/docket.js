// The dashboard's own script; htmx (auto-refresh) and uPlot (charts) are vendored next to it.
// No inline script anywhere: the pages' Content-Security-Policy allows this server's files only.
(function () {
  "use strict";

  // Auto-refresh keeps the user's place: not while they are in a form.
  document.addEventListener("htmx:beforeRequest", function (event) {
    const active = document.activeElement;
    if (event.detail.elt.id === "main" && active && active.closest && active.closest("form")) {
      event.preventDefault();
    }
  });

  // The topic page's correlation graphs, one per tier in graph order: per window what the
  // producers accepted, what the tiers feeding this one hold (when they are not the producer)
  // and what this tier holds, from the same /api/topic the page is rendered from (fetched
  // once per page load, however many graphs). Names reach the page as text only (uPlot sets
  // its labels with textContent).
  function held(cell) {
    if (!cell) return null;
    return cell.distinct === null || cell.distinct === undefined ? cell.count : cell.distinct;
  }

  function fetchHistory(box) {
    const query = new URLSearchParams({topic: box.dataset.topic, range: box.dataset.range});
    return fetch("/api/topic?" + query, {credentials: "same-origin"})
      .then((response) => (response.ok ? response.json() : null));
  }

  async function drawTier(box, histories) {
    if (typeof uPlot === "undefined" || box.dataset.drawn) return;
    box.dataset.drawn = "1";
    const key = box.dataset.topic + "\n" + box.dataset.range;
    if (!histories.has(key)) histories.set(key, fetchHistory(box));
    const hist = await histories.get(key);
    if (!hist) return;
    const tier = box.dataset.tier;
    const windows = hist.windows.slice().sort((a, b) => a.window_start - b.window_start);
    const xs = windows.map((w) => w.window_start / 1000);
    const lines = [{label: "producer", stroke: "#1d2329", width: 2, dash: [6, 4],
                    values: windows.map((w) => held(w.tiers.producer))}];
    const feeders = (hist.fed_by[tier] || []).filter((f) => f !== "producer");
    if (feeders.length) {          // what the hop expects: the feeding tiers' sum
      lines.push({label: feeders.join(" + "), stroke: "#ef8e00", width: 1.5,
                  values: windows.map((w) => feeders.reduce((sum, f) => {
                    const n = held(w.tiers[f]);
                    return sum === null || n === null ? null : sum + n;
                  }, 0))});
    }
    lines.push({label: tier, stroke: "#1f77b4", width: 1.5,
                values: windows.map((w) => held(w.tiers[tier]))});
    new uPlot({
      width: Math.max(480, Math.min(1100, box.clientWidth || 900)), height: 200,
      series: [{}].concat(lines.map((l) => ({label: l.label, stroke: l.stroke, width: l.width,
                                             dash: l.dash, spanGaps: false}))),
      axes: [{}, {label: "distinct events"}],
      scales: {x: {time: true}},
    }, [xs].concat(lines.map((l) => l.values)), box);
  }

  function init(root) {
    const histories = new Map();
    (root.querySelectorAll ? root : document).querySelectorAll("[data-chart=topic]")
      .forEach((box) => drawTier(box, histories));
  }

  document.addEventListener("DOMContentLoaded", function () {
    init(document);
    if (typeof htmx !== "undefined") htmx.onLoad(init);
  });
})();
