/* ReclaimNet relative times that keep moving on live pages.
 *
 * The server renders "3 min ago" as <time datetime="ISO" data-age-s="AGE_AT_RENDER">3 min ago</time> (the `ago`
 * filter, portal/web/templatetags/reclaimnet.py). Every ~15 s this script re-renders each one in the same words
 * the server uses (`duration` and `age` there): "just now", "4.2 s ago", "2 min 26 s ago", "1 h 5 min ago".
 * The age counts from the server's own value plus the time since the element appeared here, so a browser clock
 * that is off does not matter. Elements htmx swaps in are picked up when they arrive.
 */
(function () {
  "use strict";

  var PERIOD_MS = 15000;

  function duration(s) {
    if (s < 60) return (s < 10 && s !== Math.floor(s) ? s.toFixed(1) : String(Math.round(s))) + " s";
    if (s < 3600) {
      var whole = Math.round(s);
      var minutes = Math.floor(whole / 60);
      var rest = whole % 60;
      return rest ? minutes + " min " + rest + " s" : minutes + " min";
    }
    var totalMinutes = Math.round(s / 60);
    var hours = Math.floor(totalMinutes / 60);
    var restMinutes = totalMinutes % 60;
    return restMinutes ? hours + " h " + restMinutes + " min" : hours + " h";
  }

  function age(s) {
    return s < 1 ? "just now" : duration(s) + " ago";
  }

  function stamp(root, now) {
    var scope = root && root.querySelectorAll ? root : document;
    var found = scope.querySelectorAll("time[data-age-s]");
    for (var i = 0; i < found.length; i++) {
      var el = found[i];
      if (el.rnSeenAt === undefined) {
        el.rnSeenAt = now;
        el.rnAgeS = parseFloat(el.getAttribute("data-age-s")) || 0;
      }
    }
  }

  function render() {
    var now = Date.now();
    stamp(document, now);
    var all = document.querySelectorAll("time[data-age-s]");
    for (var i = 0; i < all.length; i++) {
      var el = all[i];
      var text = age(el.rnAgeS + (now - el.rnSeenAt) / 1000);
      if (el.textContent !== text) el.textContent = text;
    }
  }

  // The words, for the browser tests' check that they match the server's (tests/browser/test_provider_truth.py).
  window.reclaimnetTimes = { age: age, duration: duration };

  document.addEventListener("DOMContentLoaded", function () {
    stamp(document, Date.now());
    setInterval(render, PERIOD_MS);
  });
  // htmx fires htmx:load on every element it swaps in: start its clock now, not at the next render.
  document.addEventListener("htmx:load", function (e) { stamp(e.target, Date.now()); });
})();
