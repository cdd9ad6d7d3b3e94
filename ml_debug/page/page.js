// The interactive parts of an mldebug page; everything is readable without it.
(function () {
  "use strict";
  var root = document.documentElement;
  root.classList.remove("nojs");

  // "0-2,5" (what data-ranks holds) as [[0, 2], [5, 5]]: a 16k-rank range is never expanded
  function spans(text) {
    var out = [];
    text.split(",").forEach(function (part) {
      var m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
      if (m) { out.push([+m[1], m[2] === undefined ? +m[1] : +m[2]]); }
    });
    return out;
  }
  function holds(text, rank) {
    return spans(text).some(function (s) { return s[0] <= rank && rank <= s[1]; });
  }

  function setAll(scope, open) {
    scope.querySelectorAll("details").forEach(function (d) { d.open = open; });
  }

  document.querySelectorAll("[data-act]").forEach(function (button) {
    button.addEventListener("click", function () {
      var scope = document.getElementById(button.getAttribute("data-scope")) || document;
      var act = button.getAttribute("data-act");
      if (act === "open-all") { setAll(scope, true); }
      if (act === "close-all") { setAll(scope, false); }
      if (act === "suspect") {
        setAll(scope, false);
        scope.querySelectorAll(".onpath").forEach(function (d) { d.open = true; });
      }
    });
  });

  // Find a rank: every element that holds it is outlined, and the tree branches above it opened.
  var finder = document.getElementById("find-rank");
  if (finder) {
    finder.addEventListener("input", function () {
      document.querySelectorAll(".hit").forEach(function (e) { e.classList.remove("hit"); });
      var text = finder.value.trim();
      if (!/^\d+$/.test(text)) { return; }
      var rank = +text, first = null;
      document.querySelectorAll("[data-ranks]").forEach(function (e) {
        if (!holds(e.getAttribute("data-ranks"), rank)) { return; }
        var row = e.closest("tr, summary, li") || e;
        row.classList.add("hit");
        for (var d = e.parentElement; d; d = d.parentElement) {
          if (d.tagName === "DETAILS") { d.open = true; }
        }
        if (!first) { first = row; }
      });
      var count = document.getElementById("find-count");
      if (count) { count.textContent = first ? "" : "rank " + rank + " is not on this page"; }
      if (first) { first.scrollIntoView({block: "nearest"}); }
    });
  }
})();
