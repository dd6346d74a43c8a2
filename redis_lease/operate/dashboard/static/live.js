// The "refresh every 15 s" box of every page: served from /static/, as the
// Content-Security-Policy asks (no inline script anywhere). Reads nothing from the page.
(function () {
  "use strict";
  var box = document.getElementById("live");
  if (!box) return;
  box.checked = localStorage.getItem("redis-lease-live") === "1";
  box.addEventListener("change", function () {
    localStorage.setItem("redis-lease-live", box.checked ? "1" : "0");
  });
  setInterval(function () {
    if (box.checked && !document.querySelector("input:focus, textarea:focus")) location.reload();
  }, 15000);
})();
