// The report's behaviour, offline: sort and filter the verdict table; draw the charts in view
// first, then every other one (a closed point's too, so that the page prints whole); open every
// point to print.
(function () {
  "use strict";
  const specs = JSON.parse(document.getElementById("chart-specs").textContent);
  const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;

  const drawing = new Map();  // chart element -> the promise of its drawing

  function draw(element) {
    if (!drawing.has(element)) {
      const options = { renderer: "svg", actions: false, mode: "vega-lite", theme: dark ? "dark" : undefined };
      drawing.set(element, window.vegaEmbed(element, specs[element.dataset.chart], options).then(
        function () { element.dataset.drawn = "yes"; },
        function (error) { element.dataset.drawn = "failed"; element.textContent = "chart failed: " + error; }
      ));
    }
    return drawing.get(element);
  }

  function visible(element) {
    for (let node = element.parentElement; node; node = node.parentElement) {
      if (node.tagName === "DETAILS" && !node.open) return false;
    }
    return true;
  }

  function drawVisible() {
    const pending = [];
    document.querySelectorAll(".chart[data-chart]").forEach(function (element) {
      if (visible(element)) pending.push(draw(element));
    });
    return Promise.all(pending);
  }

  document.querySelectorAll("details").forEach(function (details) {
    details.addEventListener("toggle", function () { if (details.open) drawVisible(); });
  });

  // A link to a point opens it.
  function openTarget() {
    const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (target && target.tagName === "DETAILS") target.open = true;
  }
  window.addEventListener("hashchange", openTarget);

  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details").forEach(function (details) { details.open = true; });
    drawVisible();
  });

  const table = document.getElementById("verdict-table");
  if (table) {
    const body = table.tBodies[0];
    const headers = Array.from(table.tHead.rows[0].cells);
    headers.forEach(function (header, column) {
      header.addEventListener("click", function () {
        const ascending = header.getAttribute("aria-sort") !== "ascending";
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        const type = header.dataset.type;
        const key = function (row) {
          if (type === "rank") return Number(row.dataset.rank);
          const text = row.cells[column].textContent.trim();
          if (type === "number") { const value = parseFloat(text.replace(/[^0-9eE+.-]/g, "")); return isNaN(value) ? -Infinity : value; }
          return text.toLowerCase();
        };
        const rows = Array.from(body.rows);
        rows.sort(function (a, b) { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1); });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
    const text = document.getElementById("filter");
    const kind = document.getElementById("verdict-filter");
    const filter = function () {
      const words = text.value.toLowerCase();
      Array.from(body.rows).forEach(function (row) {
        const shown = (!words || row.textContent.toLowerCase().includes(words)) && (!kind.value || row.dataset.kind === kind.value);
        row.hidden = !shown;
      });
    };
    text.addEventListener("input", filter);
    kind.addEventListener("change", filter);
  }

  openTarget();
  // Points that need a look start open.
  document.querySelectorAll("tr[data-kind]").forEach(function (row) {
    if (Number(row.dataset.rank) < 4) {
      const point = document.getElementById(row.cells[0].querySelector("a").getAttribute("href").slice(1));
      if (point) point.open = true;
    }
  });
  document.documentElement.dataset.scheme = dark ? "dark" : "light";
  drawVisible()
    .then(function () {
      const rest = Array.from(document.querySelectorAll(".chart[data-chart]"));
      return rest.reduce(function (done, element) { return done.then(function () { return draw(element); }); }, Promise.resolve());
    })
    .then(function () {
      document.body.dataset.charts = "drawn";
      document.body.dataset.drawnMs = Math.round(performance.now());  // read by benchmarks/report.py
    });
})();
