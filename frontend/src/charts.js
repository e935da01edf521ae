/* ReclaimNet dashboard charts (Chart.js 4). Each <canvas data-chart="ID"> reads its data from the
 * <script type="application/json" id="ID"> that Django's json_script wrote; a live event re-fetches
 * /dashboard/charts.json (at most every 3 s) and updates every chart in place.
 * After drawing, each canvas carries data-points="N" (non-null values drawn), which the browser tests read.
 */
(function () {
  "use strict";

  var PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2"];
  var charts = {};

  function countPoints(spec) {
    return spec.datasets.reduce(function (n, ds) {
      return n + ds.data.filter(function (v) { return v !== null && v !== undefined; }).length;
    }, 0);
  }

  function config(spec) {
    var hasRight = spec.datasets.some(function (ds) { return ds.yAxisID === "y1"; });
    // Time axes thin their labels; short category axes (groups, buildings) show every one; the 24 hours of
    // day skip labels only where they do not fit (a phone), instead of piling up rotated.
    var many = spec.labels.length > 12;
    var ticks = spec.type === "line" ? { maxRotation: 0, autoSkip: true, maxTicksLimit: 6 }
      : { autoSkip: many, maxRotation: many ? 0 : 50 };
    var scales = { x: { ticks: ticks }, y: { beginAtZero: true } };
    if (hasRight) scales.y1 = { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } };
    return {
      type: spec.type,
      data: {
        labels: spec.labels,
        datasets: spec.datasets.map(function (ds, i) {
          var color = PALETTE[i % PALETTE.length];
          return Object.assign({ borderColor: color, backgroundColor: spec.type === "bar" ? color : color + "33",
                                 pointRadius: 2, cubicInterpolationMode: "monotone", spanGaps: true,
                                 borderWidth: 2 }, ds);
        })
      },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        interaction: { mode: "index", intersect: false },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
        scales: scales
      }
    };
  }

  function draw(canvas, spec) {
    var id = canvas.getAttribute("data-chart");
    if (charts[id]) charts[id].destroy();
    charts[id] = new window.Chart(canvas, config(spec));
    canvas.setAttribute("data-points", String(countPoints(spec)));
  }

  function drawAll(data) {
    document.querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var id = canvas.getAttribute("data-chart");
      var spec = data ? data[canvas.getAttribute("data-key")] : null;
      if (!spec) {
        var holder = document.getElementById(id);
        if (!holder) return;
        spec = JSON.parse(holder.textContent);
      }
      draw(canvas, spec);
    });
  }

  var pending = null;
  function refetch() {
    var url = document.body.getAttribute("data-charts-url");
    if (!url || pending) return;
    pending = setTimeout(function () {
      pending = null;
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) { if (data) drawAll(data); });
    }, 3000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!window.Chart) return;
    window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    drawAll(null);
    document.addEventListener("reclaimnet:live", refetch);
  });
})();
