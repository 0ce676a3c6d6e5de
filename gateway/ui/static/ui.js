/* Apprentice dashboard: confirmation dialogs, charts (uPlot) and polling of each page's live parts.
   No inline scripts (the pages are served with Content-Security-Policy: default-src 'self'). */
(function () {
  "use strict";

  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"];
  var charts = {};

  function confirmations() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var message = form.getAttribute && form.getAttribute("data-confirm");
      if (message && !window.confirm(message)) {
        event.preventDefault();
      }
    });
  }

  function chartOptions(element, data) {
    var series = [{}];
    data.series.forEach(function (s, i) {
      // A series with `band` is an interval bound of the series at that index: its colour, dashed.
      var band = typeof s.band === "number";
      series.push({ label: s.label, stroke: COLORS[(band ? s.band : i) % COLORS.length], width: band ? 1 : 2,
                    dash: band ? [4, 4] : undefined, spanGaps: true, points: { show: true, size: band ? 3 : 4 } });
    });
    return {
      width: Math.max(element.clientWidth, 300),
      height: 260,
      series: series,
      scales: { x: { time: true } },
      axes: [{}, { label: data.axis || "reward" }],
    };
  }

  function chartData(data) {
    return [data.x].concat(data.series.map(function (s) { return s.values; }));
  }

  function drawChart(id, data) {
    var element = document.getElementById(id);
    if (!element || typeof window.uPlot === "undefined") { return; }
    var key = JSON.stringify(data.series.map(function (s) { return s.label; }));
    var existing = charts[id];
    if (existing && existing.key === key) {
      existing.plot.setData(chartData(data));
      return;
    }
    if (existing) { existing.plot.destroy(); }
    element.textContent = "";
    if (!data.x.length) {
      element.textContent = data.empty || "No rewarded trajectories yet.";
      charts[id] = null;
      return;
    }
    charts[id] = { key: key, plot: new window.uPlot(chartOptions(element, data), chartData(data), element) };
  }

  function initialCharts() {
    var elements = document.querySelectorAll("[data-chart]");
    Array.prototype.forEach.call(elements, function (element) {
      var source = document.getElementById(element.id + "-data");
      if (source) { drawChart(element.id, JSON.parse(source.textContent)); }
    });
    window.addEventListener("resize", function () {
      Object.keys(charts).forEach(function (id) {
        var chart = charts[id];
        var element = document.getElementById(id);
        if (chart && element) { chart.plot.setSize({ width: Math.max(element.clientWidth, 300), height: 260 }); }
      });
    });
  }

  function polling() {
    var url = document.body.getAttribute("data-poll");
    if (!url) { return; }
    var every = parseInt(document.body.getAttribute("data-poll-ms") || "5000", 10);
    var etag = null;
    var busy = false;

    function apply(payload) {
      var fragments = payload.fragments || {};
      Object.keys(fragments).forEach(function (id) {
        var element = document.getElementById(id);
        if (element && element.hasAttribute("data-live")) { element.innerHTML = fragments[id]; }
      });
      var data = payload.charts || {};
      Object.keys(data).forEach(function (id) { drawChart(id, data[id]); });
    }

    function poll() {
      if (busy || document.hidden) { return; }
      busy = true;
      var headers = etag ? { "If-None-Match": etag } : {};
      fetch(url, { headers: headers, credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.status === 401) { window.location.reload(); return null; }
          if (response.status !== 200) { return null; }
          etag = response.headers.get("ETag");
          return response.json();
        })
        .then(function (payload) { if (payload) { apply(payload); } })
        .catch(function () { /* the next poll retries */ })
        .then(function () { busy = false; });
    }

    window.setInterval(poll, every);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) { poll(); } });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmations();
    initialCharts();
    polling();
  });
})();
