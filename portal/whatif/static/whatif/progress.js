// The what-if progress bar (portal/whatif/templates/whatif/detail.html): poll progress.json every second while
// the evaluation is queued or running; reload the page (which then shows the report or the error) when it ends.
(function () {
  "use strict";
  function start() {
    var box = document.querySelector("[data-progress-url]");
    if (!box) { return; }
    var url = box.getAttribute("data-progress-url");
    var bar = document.getElementById("whatif-progress");
    var state = box.querySelector("[data-state]");
    var percent = box.querySelector("[data-percent]");
    var label = box.querySelector("[data-label]");
    function poll() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (data) {
            bar.value = data.progress;
            bar.textContent = Math.round(100 * data.progress) + "%";
            state.textContent = data.state;
            percent.textContent = Math.round(100 * data.progress) + "%";
            label.textContent = data.label || "";
            if (data.state === "done" || data.state === "failed") {
              window.location.reload();
              return;
            }
          }
          window.setTimeout(poll, 1000);
        })
        .catch(function () { window.setTimeout(poll, 1000); });
    }
    window.setTimeout(poll, 1000);
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
