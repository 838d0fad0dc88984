// Live refresh, the dashboard's only script: every page works without it.
// On pages marked data-live, when "live" is ticked, the page's main part is
// fetched again every few seconds and swapped in (unless something is open or
// being typed in).
(function () {
  "use strict";
  var PERIOD_MS = 5000;
  var KEY = "pypepper-dashboard-live";
  var main = document.getElementById("main");
  var box = document.getElementById("live-refresh");
  if (!main || !box || !main.hasAttribute("data-live") || !window.fetch || !window.DOMParser) {
    return;
  }
  box.parentElement.hidden = false;
  box.checked = window.localStorage && localStorage.getItem(KEY) === "1";
  box.addEventListener("change", function () {
    if (window.localStorage) { localStorage.setItem(KEY, box.checked ? "1" : "0"); }
  });

  function busy() {
    return document.hidden || main.querySelector("details[open] details[open]") !== null ||
      (document.activeElement && main.contains(document.activeElement) &&
       /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName));
  }

  function refresh() {
    if (!box.checked || busy()) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
        if (!fresh) { return; }
        // Keep the <details> the reader opened open.
        var open = Array.prototype.map.call(main.querySelectorAll("details"), function (d) { return d.open; });
        main.innerHTML = fresh.innerHTML;
        Array.prototype.forEach.call(main.querySelectorAll("details"), function (d, i) {
          if (i < open.length) { d.open = open[i]; }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }

  window.setInterval(refresh, PERIOD_MS);
})();
