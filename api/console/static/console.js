// The console's only script: live parts and lazily loaded parts, from the console's own
// fragments. An element with data-live="URL" gets its content from URL every
// data-every ms until the fragment holds an element marked data-final; one with
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
    if (!element.querySelector("[data-final]")) { setTimeout(tick, every); }
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(live);
    document.querySelectorAll("[data-load]").forEach(function (element) {
      get(element.getAttribute("data-load")).then(function (html) { element.innerHTML = html; })
        .catch(function () { element.textContent = "The plots could not be loaded."; });
    });
  });
})();
