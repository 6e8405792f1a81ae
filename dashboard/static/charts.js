// Edgegrove dashboard charts on uPlot (vendored in /static/vendor/uplot, MIT): loss, accuracy
// and round time per round. Drag to zoom a range of rounds (all charts follow), double-click
// or "whole run" to zoom out; the cursor moves on every chart at once; the rounds shown can be
// exported as CSV. Fault windows and crash/rejoin/view marks are DOM elements over the plot
// (with their data attributes), axis titles are DOM text beside it.
// Loaded before app.js; uses its globals (model, ui, colours, formatters) at call time.
"use strict";

const CHART_HEIGHT = 190;
const CHART_PAD = { left: 16, bottom: 16 }; // room for the DOM axis titles
const CHART_SYNC = "edgegrove-rounds";

// id, header span for the last value, value of a round, formatter, y title, robust y range
function chartSeries() {
  return [
    ["chart-loss", "loss-last", (r) => r.loss, (v) => v.toFixed(3), "loss (cross-entropy)", false],
    ["chart-accuracy", "accuracy-last", (r) => r.accuracy, fmtPct, "accuracy (%)", false],
    ["chart-time", "time-last", timeOf, fmtSeconds, `${ui.timeAgent} agent (s)`, true],
  ];
}

function timeOf(r) {
  const v = ui.timeAgent === "slowest" ? r.round_seconds : r.round_seconds_median;
  return v > 0 ? v : null;
}

function chartMarks(fleet) {
  // From the server's incidents (kept for the whole run), not from the event ring buffer.
  const marks = [];
  for (const i of fleet.incidents) {
    if (i.start_round !== null) marks.push({ round: i.start_round, kind: i.kind, text: `${i.kind} ${targetsText(i.targets)}` });
    if (i.recovered_round !== null && i.kind === "crash") {
      marks.push({ round: i.recovered_round, kind: "rejoin", text: `node ${i.targets[0]} rejoined` });
    }
  }
  for (const e of model.events) {
    if (e.kind === "view_change" && e.round !== null) marks.push({ round: e.round, kind: "view_change", text: e.detail });
  }
  // One mark per kind and round: four links failing in one round are one mark.
  const seen = new Map();
  for (const mark of marks) {
    const key = `${mark.kind}@${mark.round}`;
    if (seen.has(key)) seen.get(key).text += `; ${mark.text}`;
    else seen.set(key, mark);
  }
  return [...seen.values()];
}

function yRange(values, robust) {
  // Round times: one frozen node's 13 s round must not squash every 0.2 s round to the axis,
  // so the scale stops at a few times the 90th percentile and taller points are clipped.
  if (!values.length) return [0, 1];
  const sorted = [...values].sort((a, b) => a - b);
  let lo = sorted[0];
  let hi = sorted[sorted.length - 1];
  if (robust && sorted.length >= 10) {
    const p90 = sorted[Math.floor(sorted.length * 0.9)];
    hi = Math.min(hi, Math.max(p90 * 3, sorted[Math.floor(sorted.length / 2)] * 4));
    lo = Math.min(lo, 0);
  }
  if (hi - lo < 1e-9) { lo -= 0.5 * (Math.abs(lo) || 1); hi += 0.5 * (Math.abs(hi) || 1); }
  const pad = (hi - lo) * 0.08;
  return [robust ? Math.max(0, lo - pad) : lo - pad, hi + pad];
}

function chartContext() {
  const fleet = model.fleet;
  const rounds = [...model.rounds.values()].sort((a, b) => a.round - b.round);
  const xs = rounds.map((r) => r.round);
  const x0 = xs.length ? xs[0] : 0;
  const x1 = Math.max(x0 + 1, xs.length ? xs[xs.length - 1] : 0, fleet.fleet_round ?? 0);
  return { rounds, xs, x0, x1, marks: chartMarks(fleet), incidents: fleet.incidents, now: fleet.fleet_round };
}

function renderCharts() {
  const context = chartContext();
  ui.chartContext = context;
  for (const [id, lastId, pick, fmt, yTitle, robust] of chartSeries()) {
    const ys = context.rounds.map((r) => { const v = pick(r); return v === null || v === undefined ? null : v; });
    const present = ys.filter((v) => v !== null);
    const chart = ensureChart(id, yTitle, id === "chart-accuracy");
    chart.yRange = yRange(present, robust);
    chart.box.dataset.points = String(present.length);
    chart.box.querySelector(".axis-title.y").textContent = yTitle;
    chart.empty.hidden = present.length > 0;
    chart.plot.setData([context.xs, ys], false);
    applyZoom(chart.plot, context);
    let last = null;
    for (let k = ys.length - 1; k >= 0; k -= 1) if (ys[k] !== null) { last = [context.xs[k], ys[k]]; break; }
    document.getElementById(lastId).textContent = last ? `round ${last[0]}: ${fmt(last[1])}` : "";
  }
  renderZoomBar(context);
}

function applyZoom(plot, context) {
  // The whole run (to the fleet's round now), or the range the operator chose.
  const [lo, hi] = ui.zoom || [context.x0, context.x1];
  ui.settingScale = true;
  try { plot.setScale("x", { min: lo, max: hi }); } finally { ui.settingScale = false; }
}

function ensureChart(id, yTitle, percent) {
  const existing = ui.charts[id];
  const box = document.getElementById(id);
  const width = Math.max(200, box.clientWidth - CHART_PAD.left);
  if (existing) {
    if (existing.plot.width !== width) existing.plot.setSize({ width, height: CHART_HEIGHT });
    return existing;
  }
  box.replaceChildren();
  const chart = { box, yRange: [0, 1], overlay: null, empty: null, plot: null };
  const yTitleEl = html("div", "axis-title y", yTitle);
  const xTitleEl = html("div", "axis-title x", "round");
  chart.empty = html("div", "chart-empty", "no data yet");
  const opts = {
    width, height: CHART_HEIGHT, legend: { show: false },
    cursor: {
      sync: { key: CHART_SYNC, setSeries: false },
      drag: { x: true, y: false, setScale: true },
      points: { size: 6 },
    },
    scales: { x: { time: false }, y: { range: () => chart.yRange } },
    axes: [
      { stroke: "#6b7280", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#c9d0da" }, size: 30,
        values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : "")) },
      { stroke: "#6b7280", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#c9d0da" }, size: 44,
        values: (u, ticks) => ticks.map((t) => (percent ? `${+(t * 100).toPrecision(3)}`
          : Math.abs(t) >= 100 ? t.toFixed(0) : `${+t.toPrecision(3)}`)) },
    ],
    series: [{}, { stroke: "#2f6fdf", width: 2, spanGaps: true,
      points: { show: (u) => u.data[0].length <= 400, size: 5, fill: "#2f6fdf" } }],
    hooks: {
      draw: [(u) => drawOverlay(chart, u)],
      setScale: [(u, key) => { if (key === "x") zoomed(u); }],
      setCursor: [(u) => cursorMoved(chart, u)],
    },
  };
  chart.plot = new uPlot(opts, [[], []], box);
  chart.overlay = html("div", "chart-overlay");
  chart.plot.over.appendChild(chart.overlay);
  box.append(yTitleEl, xTitleEl, chart.empty);
  box.addEventListener("mouseenter", () => { ui.hoverChart = id; });
  box.addEventListener("mouseleave", () => { if (ui.hoverChart === id) ui.hoverChart = null; hideTip(); });
  ui.charts[id] = chart;
  return chart;
}

function zoomed(u) {
  // A drag on one chart (or a double-click back out) sets the range of all of them.
  if (ui.settingScale || !ui.chartContext) return;
  const { min, max } = u.scales.x;
  const c = ui.chartContext;
  const lastX = c.xs.length ? c.xs[c.xs.length - 1] : c.x1; // uPlot's own zoom-out: the data's range
  ui.zoom = (min <= c.x0 && max >= lastX) ? null : [Math.max(c.x0, Math.floor(min)), Math.min(c.x1, Math.ceil(max))];
  if (ui.zoom && ui.zoom[1] - ui.zoom[0] < 1) ui.zoom = [ui.zoom[0], ui.zoom[0] + 1];
  for (const other of Object.values(ui.charts)) applyZoom(other.plot, c);
  renderZoomBar(c);
}

function drawOverlay(chart, u) {
  // Fault windows and marks over the plot, placed by uPlot's own scale after every draw.
  const context = ui.chartContext;
  if (!context || !chart.overlay) return;
  const { min, max } = u.scales.x;
  chart.box.dataset.xMin = String(Math.round(min));
  chart.box.dataset.xMax = String(Math.round(max));
  const pos = (x) => u.valToPos(x, "x");
  const nodes = [];
  for (const i of context.incidents) {
    if (i.start_round === null) continue;
    const end = i.end_round ?? context.now ?? context.x1;
    const a = Math.max(min, i.start_round);
    const b = Math.min(max, Math.max(end, i.start_round + 0.5));
    if (b < min || a > max) continue;
    const band = html("div", "incident-band");
    Object.assign(band.dataset, { incident: i.id, kind: i.kind, start: i.start_round, end: i.end_round ?? "",
      active: i.active, source: i.source });
    band.style.left = `${pos(a)}px`;
    band.style.width = `${Math.max(2, pos(b) - pos(a))}px`;
    band.style.background = FAULT_COLORS[i.kind] || COLORS.failed;
    band.title = `${i.title}: rounds ${i.start_round}–${i.end_round ?? "now"}`;
    nodes.push(band);
  }
  for (const mark of context.marks) {
    if (mark.round < min || mark.round > max) continue;
    const line = html("div", "mark");
    Object.assign(line.dataset, { kind: mark.kind, round: mark.round });
    line.style.left = `${pos(mark.round)}px`;
    line.style.setProperty("--mark", MARK_COLORS[mark.kind] || COLORS.unknown);
    line.title = `round ${mark.round}: ${mark.text}`;
    nodes.push(line);
  }
  const [, y1] = chart.yRange;
  const ys = u.data[1];
  for (let k = 0; k < ys.length; k += 1) {
    const x = u.data[0][k];
    if (ys[k] === null || ys[k] <= y1 || x < min || x > max) continue;
    const dot = html("div", "clipped");
    dot.dataset.round = x;
    dot.title = `round ${x}: ${ys[k]} (off the scale)`;
    dot.style.left = `${pos(x)}px`;
    nodes.push(dot);
  }
  chart.overlay.replaceChildren(...nodes);
}

function cursorMoved(chart, u) {
  const idx = u.cursor.idx;
  const round = idx === null || idx === undefined ? null : u.data[0][idx];
  chart.box.dataset.cursorRound = round === null || round === undefined ? "" : String(round);
  if (ui.hoverChart !== chart.box.id) return; // the synced charts follow; one tip, by the pointer
  if (round === null || round === undefined) { hideTip(); return; }
  showTip(round, chart.box, u.cursor.left);
}

function showTip(round, box, left) {
  // Hover: the round under the pointer, with that round's numbers.
  const r = model.rounds.get(round);
  const tip = document.getElementById("chart-tip");
  if (!r) { tip.hidden = true; return; }
  const active = model.fleet.incidents.filter((i) => i.start_round !== null && i.start_round <= round
    && (i.end_round === null || round < i.end_round)).map((i) => `${i.kind} ${targetsText(i.targets)}`);
  tip.textContent = `round ${round} · loss ${fmtNum(r.loss)} · accuracy ${fmtPct(r.accuracy)} · `
    + `time median ${fmtSeconds(r.round_seconds_median)}, slowest ${fmtSeconds(r.round_seconds)}`
    + ` · ${r.reports} reports${r.degraded ? ` · degraded (${r.missing_chunks} chunks missing)` : ""}`
    + (active.length ? ` · faults: ${active.join(", ")}` : "");
  tip.hidden = false;
  const over = ui.charts[box.id].plot.over.getBoundingClientRect();
  const x = over.left + left;
  const pageLeft = Math.min(x + 12, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = `${Math.max(4, pageLeft) + window.scrollX}px`;
  tip.style.top = `${over.bottom + 4 + window.scrollY}px`;
}

function hideTip() { document.getElementById("chart-tip").hidden = true; }

function renderZoomBar(context) {
  const bar = document.getElementById("chart-zoom");
  const zoom = ui.zoom;
  bar.dataset.zoomed = zoom ? "true" : "false";
  document.getElementById("chart-range").textContent = context.xs.length
    ? (zoom ? `rounds ${zoom[0]}–${zoom[1]} of ${context.x0}–${context.x1} (drag to zoom, double-click to zoom out)`
      : `rounds ${context.x0}–${context.x1} (drag across a chart to zoom)`) : "";
  document.getElementById("zoom-reset").disabled = !zoom;
}

function resetZoom() {
  ui.zoom = null;
  if (ui.chartContext) for (const chart of Object.values(ui.charts)) applyZoom(chart.plot, ui.chartContext);
  if (ui.chartContext) renderZoomBar(ui.chartContext);
}

function roundsCsv() {
  // The rounds in the charts' range, one row each: what the charts plot, and a little more.
  const [lo, hi] = ui.zoom || [-Infinity, Infinity];
  const head = ["round", "epoch", "loss", "accuracy", "round_seconds_median", "round_seconds_slowest",
    "reports", "members", "degraded", "missing_chunks", "reroutes", "timeouts", "bytes_sent"];
  const cell = (v) => (v === null || v === undefined ? "" : String(v));
  const rows = [...model.rounds.values()].filter((r) => r.round >= lo && r.round <= hi)
    .sort((a, b) => a.round - b.round)
    .map((r) => [r.round, r.epoch, r.loss, r.accuracy, r.round_seconds_median, r.round_seconds,
      r.reports, r.members, r.degraded, r.missing_chunks, r.reroutes, r.timeouts, r.bytes_sent].map(cell).join(","));
  return [head.join(","), ...rows].join("\n") + "\n";
}

function exportCsv() {
  const blob = new Blob([roundsCsv()], { type: "text/csv" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  const job = model.fleet ? model.fleet.job : "fleet";
  link.download = ui.zoom ? `${job}-rounds-${ui.zoom[0]}-${ui.zoom[1]}.csv` : `${job}-rounds.csv`;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}
