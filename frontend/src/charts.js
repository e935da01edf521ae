/* ReclaimNet dashboard charts (Chart.js 4). Each <canvas data-chart="ID"> reads its data from the
 * <script type="application/json" id="ID"> that Django's json_script wrote; a live event re-fetches
 * the chart data of the range shown (body[data-charts-url], at most every 3 s) and updates every chart in place.
 * Every scale is titled with its quantity and unit (spec.axes); x labels skip rather than overlap.
 * After drawing, each canvas carries data-points="N" (non-null values drawn), which the browser tests read.
 * The time-range picker submits itself when a preset is picked, and switches to "Custom" when a day is typed.
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

  function title(text, color) {
    return { display: !!text, text: text || "", color: color || undefined, font: { weight: "600" } };
  }

  function config(spec) {
    var axes = spec.axes || {};
    var horizontal = spec.indexAxis === "y";
    var category = horizontal ? "y" : "x";
    var value = horizontal ? "x" : "y";
    var second = horizontal ? "x1" : "y1";
    // Category labels (periods, hours, groups, links) never overlap: Chart.js drops the ones that do not fit,
    // after rotating at most 45°; a time axis stays horizontal and thins out.
    var time = spec.type === "line";
    var ticks = { autoSkip: true, autoSkipPadding: 8, maxRotation: time || horizontal ? 0 : 45, minRotation: 0 };
    var scales = {};
    scales[category] = { ticks: ticks, title: title(axes[category]) };
    scales[value] = { beginAtZero: true, title: title(axes[value]) };
    var secondIndex = -1;
    spec.datasets.forEach(function (ds, i) {
      if (ds.yAxisID === second || ds.xAxisID === second) secondIndex = i;
    });
    if (secondIndex >= 0) {
      // Two quantities of different size: each axis is titled and coloured like its dataset.
      var firstColor = PALETTE[secondIndex === 0 ? 1 : 0];
      var secondColor = PALETTE[secondIndex % PALETTE.length];
      scales[value].title = title(axes[value], firstColor);
      scales[value].ticks = { color: firstColor };
      scales[second] = { beginAtZero: true, position: horizontal ? "top" : "right",
                         grid: { drawOnChartArea: false }, title: title(axes[second], secondColor),
                         ticks: { color: secondColor } };
    }
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
        indexAxis: horizontal ? "y" : "x",
        interaction: { mode: "index", intersect: false, axis: category },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
        scales: scales
      }
    };
  }

  function draw(canvas, spec) {
    var id = canvas.getAttribute("data-chart");
    if (spec.indexAxis === "y" && canvas.parentNode) {
      // A row per name: the chart grows with them, so no name is skipped for lack of room.
      var rows = spec.labels.length * (10 + 12 * spec.datasets.length);
      canvas.parentNode.style.height = Math.max(240, 90 + rows) + "px";
    }
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

  function rangePicker(form) {
    var dates = form.querySelectorAll("input[type=date]");
    var custom = form.querySelector("input[name=range][value=custom]");
    form.addEventListener("change", function (event) {
      var target = event.target;
      if (target.name === "range" && target.value !== "custom") {
        // A preset needs no days: leave them out of the URL, which stays short and bookmarkable.
        dates.forEach(function (input) { input.disabled = true; });
        form.submit();
      } else if (target.type === "date" && custom) {
        custom.checked = true;
      }
    });
    form.addEventListener("submit", function () {
      if (custom && !custom.checked) dates.forEach(function (input) { input.disabled = true; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-range-picker]").forEach(rangePicker);
    if (!window.Chart) return;
    window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    drawAll(null);
    document.addEventListener("reclaimnet:live", refetch);
  });
})();
