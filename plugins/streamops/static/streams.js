// The Streams pages' charts, flow graphs and trends, drawn with Plotly (served by this
// plugin from the plotly package the project installs). Every number comes from the
// pages' own JSON (streamops.page_data); nothing here builds HTML from data (textContent only).
(function () {
  "use strict";
  const STATUS = {healthy: "#2e7d32", idle: "#2e7d32", passed: "#2e7d32", lagging: "#b7791f",
                  starting: "#b7791f", stalled: "#c62828", dead: "#c62828", corrupt: "#c62828", blocked: "#c62828",
                  failed: "#c62828"};
  const MARKS = {start: "#2e7d32", restart: "#c62828", stop: "#555555", failure: "#c62828",
                 validation: "#1565c0", "validation failed": "#c62828", continuous: "#6a1b9a", scheduled: "#8e24aa"};
  const CONFIG = {displaylogo: false, responsive: true};
  const REFRESH_MS = 15000;

  async function getJson(url) {
    const response = await fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}});
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }

  function say(el, text) {
    let note = el.querySelector(".note");
    if (!note) { note = document.createElement("p"); note.className = "note muted"; el.prepend(note); }
    note.textContent = text;
  }

  function chartLayout(chart, data) {
    const marks = data.markers;
    const layout = {
      title: {text: chart.title, font: {size: 14}}, height: 250, margin: {l: 55, r: chart.y2 ? 60 : 20, t: 34, b: 28},
      xaxis: {type: "date", range: [data.since, data.until]},
      yaxis: {title: {text: chart.y}, rangemode: "tozero"},
      legend: {orientation: "h", y: -0.18}, showlegend: true,
      shapes: marks.map(m => ({type: "line", xref: "x", yref: "paper", x0: m.at, x1: m.at, y0: 0, y1: 1,
                               line: {color: MARKS[m.kind] || "#555", width: 1, dash: "dot"}})),
      annotations: marks.map(m => ({x: m.at, y: 1, xref: "x", yref: "paper", text: m.kind, hovertext: m.text,
                                    showarrow: false, textangle: -90, xanchor: "right", yanchor: "top",
                                    font: {size: 9, color: MARKS[m.kind] || "#555"}})),
    };
    if (chart.y2) layout.yaxis2 = {title: {text: chart.y2}, overlaying: "y", side: "right", rangemode: "tozero"};
    return layout;
  }

  async function drawCharts(el) {
    const data = await getJson(el.dataset.url);
    say(el, "From " + data.since + " to " + data.until + ", " + data.resolution + ".");
    for (const chart of data.charts) {
      const div = document.getElementById("chart-" + chart.id);
      if (!div) continue;
      const traces = chart.traces.map(t => Object.assign({type: "scatter", mode: "lines+markers", marker: {size: 3}}, t));
      const layout = chartLayout(chart, data);
      if (!traces.some(t => t.x.length)) {
        layout.annotations = layout.annotations.concat([{text: "no data in this range", xref: "paper", yref: "paper",
                                                         x: 0.5, y: 0.5, showarrow: false}]);
      }
      await Plotly.react(div, traces, layout, CONFIG);
      div.dataset.traces = String(traces.length);
    }
  }

  function nodeTable(table, nodes) {
    table.replaceChildren();
    const head = table.insertRow();
    for (const name of ["part", "rows in", "rows out", "status", "details"]) {
      const th = document.createElement("th"); th.textContent = name; head.appendChild(th);
    }
    for (const node of nodes) {
      const row = table.insertRow();
      row.dataset.node = node.key;
      const first = row.insertCell();
      if (node.url) { const a = document.createElement("a"); a.href = node.url; a.textContent = node.label; first.appendChild(a); }
      else first.textContent = node.label;
      row.insertCell().textContent = String(node.rows_in);
      row.insertCell().textContent = String(node.rows_out);
      const status = row.insertCell(); status.textContent = node.status || "-"; status.className = node.status || "";
      row.insertCell().textContent = node.detail;
    }
  }

  async function drawFlow(el) {
    const data = await getJson(el.dataset.url);
    const nodes = data.nodes, plot = el.querySelector(".plot");
    const trace = {
      type: "sankey", arrangement: "snap", valueformat: "d",
      node: {label: nodes.map(n => n.label), color: nodes.map(n => STATUS[n.status] || "#90a4ae"), pad: 18, thickness: 16,
             customdata: nodes.map(n => n.detail + "<br>rows in " + n.rows_in + ", out " + n.rows_out),
             hovertemplate: "%{label}<br>%{customdata}<extra></extra>"},
      link: {source: data.links.map(l => l.source), target: data.links.map(l => l.target),
             value: data.links.map(l => Math.max(l.value, 0)), label: data.links.map(l => l.label),
             hovertemplate: "%{label}: %{value} rows<extra></extra>"},
    };
    await Plotly.react(plot, [trace], {height: 340, margin: {l: 10, r: 10, t: 10, b: 10}}, CONFIG);
    if (!plot.dataset.clicks) {
      plot.dataset.clicks = "on";
      plot.on("plotly_click", event => {
        const point = event.points && event.points[0];
        const node = point && point.sourceLinks !== undefined ? nodes[point.index] : null;
        if (node && node.url) window.location.href = node.url;
      });
    }
    nodeTable(el.querySelector("table.nodes"), nodes);
    if (!data.links.some(l => l.value > 0)) say(el, "No rows flowed in this range.");
  }

  async function drawTrends(el) {
    const data = await getJson(el.dataset.url);
    for (const t of data) {
      const div = document.querySelector(".trend[data-stream='" + CSS.escape(t.stream) + "']");
      if (!div) continue;
      const traces = t.traces.map(x => Object.assign({type: "scatter", mode: "lines", line: {width: 1.5}}, x));
      await Plotly.react(div, traces, {
        height: 70, width: 260, margin: {l: 28, r: 28, t: 4, b: 16}, showlegend: false,
        xaxis: {type: "date", range: [t.since, t.until], showgrid: false, tickfont: {size: 8}, nticks: 3, tickformat: "%H:%M"},
        yaxis: {rangemode: "tozero", tickfont: {size: 8}, nticks: 3},
        yaxis2: {overlaying: "y", side: "right", rangemode: "tozero", tickfont: {size: 8}, nticks: 3},
      }, {displayModeBar: false, staticPlot: true});
      div.dataset.traces = String(traces.length);
    }
  }

  async function refreshRow(el) {
    const response = await fetch(el.dataset.rowUrl, {credentials: "same-origin"});
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString("<table>" + await response.text() + "</table>", "text/html")
      .querySelector("tr");
    if (fresh) el.replaceWith(fresh);
  }

  function every(run) {
    const go = () => run().catch(error => console.error(error));
    go();
    window.setInterval(go, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const charts = document.getElementById("streams-charts");
    if (charts) every(() => drawCharts(charts));
    const flow = document.getElementById("streams-flow");
    if (flow) every(() => drawFlow(flow));
    const trends = document.getElementById("streams-trends");
    if (trends) drawTrends(trends).catch(error => console.error(error));
    const row = document.querySelector("tr[data-row-url]");
    if (row) window.setInterval(() => refreshRow(document.querySelector("tr[data-row-url]")), REFRESH_MS);
  });
})();
