/* ReclaimNet live updates: one websocket per tab (/ws/live/, session-authenticated).
 *
 * The server sends {"event": "job.state" | "node.state" | "reclaim" | "migration" | "checkpoint", ...ids}.
 * Events carry ids, not state: each element with data-live="topic topic…" is re-fetched by htmx (it declares
 * hx-get + hx-trigger="live") when an event matches one of its topics. Topics of an event: "*", the event name,
 * its first word ("job" for "job.state"), and "<kind>-<id>" for each *_id field (job-12, node-3, …).
 * A page asks to follow single objects with <body data-follow="job-12">.
 */
(function () {
  "use strict";

  var ID_KINDS = ["node", "job", "provider", "group", "reclaim", "migration", "checkpoint"];
  var retryDelay = 1000;
  var socket = null;
  var recent = {};  // an event sent to two of our groups (job-12 and group-3) arrives twice: act once

  function isRepeat(raw) {
    var now = Date.now();
    Object.keys(recent).forEach(function (key) { if (now - recent[key] > 2000) delete recent[key]; });
    if (recent[raw]) return true;
    recent[raw] = now;
    return false;
  }

  function topicsOf(msg) {
    var topics = { "*": true };
    if (msg.event) {
      topics[msg.event] = true;
      topics[String(msg.event).split(".")[0]] = true;
    }
    ID_KINDS.forEach(function (kind) {
      var value = msg[kind + "_id"];
      if (value !== undefined && value !== null) topics[kind + "-" + value] = true;
    });
    return topics;
  }

  function refresh(msg) {
    var topics = topicsOf(msg);
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var wanted = el.getAttribute("data-live").split(/\s+/);
      if (wanted.some(function (t) { return topics[t]; }) && window.htmx) {
        window.htmx.trigger(el, "live");
      }
    });
    document.dispatchEvent(new CustomEvent("reclaimnet:live", { detail: msg }));
  }

  function describe(msg) {
    var what = { "job.state": "Job", "node.state": "Node", reclaim: "Reclaim", migration: "Migration",
                 checkpoint: "Checkpoint" }[msg.event] || msg.event;
    var parts = [what];
    if (msg.job_id !== undefined) parts.push("job #" + msg.job_id);
    if (msg.node !== undefined) parts.push(String(msg.node));
    else if (msg.node_id !== undefined) parts.push("node #" + msg.node_id);
    var status = msg.state || msg.outcome || msg.status || msg.mode || "";
    return parts.join(" · ") + (status ? ": " + status : "");
  }

  function toast(text) {
    var log = document.getElementById("live-log");
    if (!log) return;
    var item = document.createElement("p");
    item.className = "toast";
    item.textContent = text;
    log.prepend(item);
    while (log.children.length > 4) log.removeChild(log.lastChild);
    setTimeout(function () { if (item.parentNode) item.parentNode.removeChild(item); }, 8000);
  }

  function setStatus(state) {
    document.body.setAttribute("data-live-state", state);
    var el = document.getElementById("live-status");
    if (el) {
      el.className = "live-dot live-" + state;
      el.title = state === "open" ? "Live updates on" : "Live updates reconnecting…";
      el.querySelector(".sr").textContent = el.title;
    }
  }

  function connect() {
    var proto = window.location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(proto + "://" + window.location.host + "/ws/live/");
    socket.onopen = function () {
      retryDelay = 1000;
      var follow = (document.body.getAttribute("data-follow") || "").split(/\s+/).filter(Boolean);
      if (follow.length) socket.send(JSON.stringify({ follow: follow }));
      else setStatus("open");
    };
    socket.onmessage = function (e) {
      var msg;
      try { msg = JSON.parse(e.data); } catch (err) { return; }
      if (msg.event === "hello") return;
      if (msg.event === "following") { setStatus("open"); return; }
      if (isRepeat(e.data)) return;
      refresh(msg);
      toast(describe(msg));
    };
    socket.onclose = function (e) {
      setStatus("closed");
      if (e.code === 4401) return;  // not signed in: do not hammer the server
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.body.hasAttribute("data-user")) connect();
  });
})();
