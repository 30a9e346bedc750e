// The console's only script: live parts and lazily loaded parts, from the console's own
// fragments. An element with data-live="URL" gets its content from URL every
// data-every ms until the fragment holds an element marked data-final (or, with
// data-events="URL", each time that event stream says the job changed); one with
// data-load="URL" gets it once. Without this script every page still works (reload).
(function () {
  "use strict";
  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Console": "fragment" } })
      .then(function (answer) {
        if (answer.status === 401) { window.location.assign("/console/login"); }
        if (!answer.ok) { throw new Error(String(answer.status)); }
        return answer.text();
      });
  }
  function keepFocus(element, html) {
    // Replacing the content would drop the keyboard focus inside it: put it back.
    var focused = document.activeElement;
    var id = focused && element.contains(focused) ? focused.id : null;
    element.innerHTML = html;
    if (id) { var again = document.getElementById(id); if (again) { again.focus(); } }
  }
  function live(element) {
    var every = parseInt(element.getAttribute("data-every") || "2000", 10);
    function tick() {
      get(element.getAttribute("data-live")).then(function (html) {
        keepFocus(element, html);
        if (!element.querySelector("[data-final]")) { setTimeout(tick, every); }
      }).catch(function () { setTimeout(tick, every * 3); });
    }
    if (element.querySelector("[data-final]")) { return; }
    if (element.hasAttribute("data-events") && window.EventSource) { follow(element, every, tick); }
    else { setTimeout(tick, every); }
  }
  function follow(element, every, poll) {
    // data-events="URL": the job's event stream says when it changed; the fragment is
    // then fetched again, at most once every data-every ms. A server without the
    // stream (or one that ends it for good) leaves the timer to do it.
    var source = new EventSource(element.getAttribute("data-events"));
    var due = false, busy = false, last = 0;
    function refresh() {
      if (busy || !due) { return; }
      var wait = last + every - Date.now();
      if (wait > 0) { setTimeout(refresh, wait); return; }
      due = false; busy = true; last = Date.now();
      get(element.getAttribute("data-live")).then(function (html) {
        keepFocus(element, html);
        if (element.querySelector("[data-final]")) { source.close(); }
      }).catch(function () { due = true; }).then(function () { busy = false; refresh(); });
    }
    source.addEventListener("job", function () { due = true; refresh(); });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED && !element.querySelector("[data-final]")) {
        setTimeout(poll, every);
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    document.querySelectorAll("[data-load]").forEach(function (element) {
      get(element.getAttribute("data-load")).then(function (html) { element.innerHTML = html; })
        .catch(function () { element.textContent = "The plots could not be loaded."; });
    });
  });
})();
