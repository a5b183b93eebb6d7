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

  const COLOURS = ["#1d2329", "#1f77b4", "#2e8540", "#ef8e00", "#6d4c9f", "#c62828"];

  // The topic page's correlation view: what the producer said it wrote and what each tier
  // holds, per window, from the same /api/topic the page itself is rendered from.
  async function drawTopic(box) {
    if (typeof uPlot === "undefined" || box.dataset.drawn) return;
    box.dataset.drawn = "1";
    const query = new URLSearchParams({topic: box.dataset.topic, range: box.dataset.range});
    const response = await fetch("/api/topic?" + query, {credentials: "same-origin"});
    if (!response.ok) return;
    const hist = await response.json();
    const windows = hist.windows.slice().sort((a, b) => a.window_start - b.window_start);
    const xs = windows.map((w) => w.window_start / 1000);
    const counts = hist.tiers.map((t) => windows.map((w) => (w.tiers[t] ? w.tiers[t].count : null)));
    const series = [{}].concat(hist.tiers.map((t, i) => ({
      label: t, stroke: COLOURS[i % COLOURS.length], width: i === 0 ? 2 : 1.5,
      dash: i === 0 ? [6, 4] : undefined, spanGaps: false,
    })));
    new uPlot({
      width: Math.max(480, Math.min(1100, box.clientWidth || 900)), height: 260,
      series: series, axes: [{}, {label: "events per window"}],
      scales: {x: {time: true}},
    }, [xs].concat(counts), box);
  }

  function init(root) {
    (root.querySelectorAll ? root : document).querySelectorAll("[data-chart=topic]").forEach(drawTopic);
  }

  document.addEventListener("DOMContentLoaded", function () {
    init(document);
    if (typeof htmx !== "undefined") htmx.onLoad(init);
  });
})();
