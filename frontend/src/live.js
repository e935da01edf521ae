/* ReclaimNet live updates: one websocket per tab (/ws/live/, session-authenticated).
 *
 * Two kinds of message arrive:
 * 1. Internal refresh events {"event": "job.state" | "node.state" | "reclaim" | "migration" | "checkpoint", ...ids}.
 *    They carry ids, not state: each element with data-live="topic topic…" is re-fetched by htmx (it declares
 *    hx-get + hx-trigger="live") when an event matches one of its topics. Topics of an event: "*", the event name,
 *    its first word ("job" for "job.state"), and "<kind>-<id>" for each *_id field (job-12, node-3, …).
 *    A page asks to follow single objects with <body data-follow="job-12">. They never raise a toast.
 * 2. Notices {"event": "notice", "name", "level", "text", "url"}: an event this person cares about (portal/core/
 *    events.py: placed, moved, lost work, …), in words the server wrote. Each becomes a toast in #live-log, a strip
 *    of its own above the page's content (it pushes the content down, never covers it), newest first, at most 4;
 *    a toast goes away 12 s after it was first on screen, or when dismissed.
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

  var TOAST_SHOWN_MS = 12000;
  var MAX_TOASTS = 4;

  function removeToast(item) {
    if (item.parentNode) item.parentNode.removeChild(item);
  }

  // The countdown starts when the toast is on screen: one that arrives while the page is scrolled away waits.
  function expireWhenSeen(item) {
    if (!("IntersectionObserver" in window)) {
      setTimeout(function () { removeToast(item); }, TOAST_SHOWN_MS);
      return;
    }
    var observer = new IntersectionObserver(function (entries) {
      if (entries.some(function (entry) { return entry.isIntersecting; })) {
        observer.disconnect();
        setTimeout(function () { removeToast(item); }, TOAST_SHOWN_MS);
      }
    });
    observer.observe(item);
  }

  function toast(msg) {
    var log = document.getElementById("live-log");
    if (!log || !msg.text) return;
    var item = document.createElement("div");
    item.className = "toast toast-" + (msg.level || "info");
    item.setAttribute("data-event", msg.name || "");
    var text = document.createElement("p");
    text.textContent = msg.text;
    item.appendChild(text);
    if (msg.url && msg.url !== window.location.pathname) {
      var link = document.createElement("a");
      link.href = msg.url;
      link.textContent = "Open";
      item.appendChild(link);
    }
    var close = document.createElement("button");
    close.type = "button";
    close.className = "toast-close";
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "\u00d7";
    close.addEventListener("click", function () { removeToast(item); });
    item.appendChild(close);
    log.prepend(item);
    while (log.children.length > MAX_TOASTS) log.removeChild(log.lastChild);
    expireWhenSeen(item);
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
      if (msg.event === "notice") { toast(msg); return; }
      refresh(msg);
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
