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
      if (act === "icicle") {
        var box = document.getElementById("icicle");
        if (box.hidden) { drawIcicle(scope, box); }
        box.hidden = !box.hidden;
        button.textContent = box.hidden ? "icicle" : "hide icicle";
      }
      if (act === "suspect") {
        setAll(scope, false);
        scope.querySelectorAll(".onpath").forEach(function (d) { d.open = true; });
      }
    });
  });

  // The tree as an icicle: one row per depth, each branch as wide as its share of the processes (the
  // outermost frame on top); the suspect's branch at least MIN_SUSPECT wide, so that one rank in 16k
  // still shows. A click on a cell opens that branch in the tree below and shows it.
  var MIN_SUSPECT = 0.04;
  function kids(d) { return Array.prototype.slice.call(d.querySelectorAll(":scope > ul > li > details")); }
  function count(d) { return +d.getAttribute("data-count"); }
  function shares(list, width) {
    var sum = 0, mine = 0, rest = 0;
    list.forEach(function (d) { sum += count(d); });
    var out = list.map(function (d) {
      var share = count(d) / sum;
      if (d.classList.contains("mine") || d.classList.contains("onpath")) {
        share = Math.max(share, Math.min(0.5, MIN_SUSPECT / width));
        mine += share;
      } else {
        rest += share;
      }
      return share;
    });
    return out.map(function (share, i) {
      var d = list[i];
      var marked = d.classList.contains("mine") || d.classList.contains("onpath");
      return marked || rest === 0 ? share : share * (1 - mine) / rest;
    });
  }
  function drawIcicle(tree, box) {
    box.textContent = "";
    var depth = 0;
    function place(list, left, width, level) {
      var parts = shares(list, width);
      list.forEach(function (d, i) {
        var w = parts[i] * width;
        var cell = document.createElement("div");
        cell.className = "cell" + (d.classList.contains("onpath") ? " onpath" : "") +
          (d.classList.contains("mine") ? " mine" : "");
        cell.style.left = (left * 100) + "%";
        cell.style.width = (w * 100) + "%";
        cell.style.top = (level * 22) + "px";
        cell.textContent = d.getAttribute("data-frame").split(" (")[0];  // the title has the file, the ranks
        cell.title = d.querySelector("summary").textContent;
        cell.addEventListener("click", function () {
          for (var p = d; p; p = p.parentElement) { if (p.tagName === "DETAILS") { p.open = true; } }
          d.querySelector("summary").scrollIntoView({block: "center"});
        });
        box.appendChild(cell);
        depth = Math.max(depth, level + 1);
        var children = kids(d);
        if (children.length) { place(children, left, w, level + 1); }
        left += w;
      });
    }
    place(Array.prototype.slice.call(tree.querySelectorAll(":scope > li > details")), 0, 1, 0);
    box.style.height = (depth * 22) + "px";
  }

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
