// Edgegrove dashboard charts on uPlot (vendored in /static/vendor/uplot, MIT): loss, accuracy
// and round time per round. Drag to zoom a range of rounds (all charts follow), double-click
// or "whole run" to zoom out; the cursor moves on every chart at once; the rounds shown can be
// exported as CSV, each chart as a PNG image. Fault windows and crash/rejoin/view marks are DOM
// elements over the plot (with their data attributes), axis titles are DOM text beside it.
// Picking nodes ("per node") adds each one's own series, from /api/nodes/{node}/series: its
// round time on the round time chart, and its CPU, memory and link bytes on charts of their own.
// Loaded before app.js; uses its globals (model, ui, colours, formatters) at call time.
"use strict";

const CHART_HEIGHT = 190;
const CHART_PAD = { left: 16, bottom: 16 }; // room for the DOM axis titles
const CHART_SYNC = "edgegrove-rounds";
const FLEET_STROKE = "#2f6fdf";
// One colour per node (by id), none of them the fleet's blue.
const NODE_COLORS = ["#e8590c", "#2b8a3e", "#9c36b5", "#c92a2a", "#0b7285", "#5f3dc4", "#a61e4d",
  "#5c940d", "#495057", "#d9480f"];
const NODE_PAGE = 5000; // rounds per /api/nodes/{node}/series request
const NODE_REFRESH_MS = 1000; // a picked node's new rounds are fetched at most this often
const OPERATOR_MARK = "operator-action"; // the marks of the operator's commands (not a fault kind)
const OPERATOR_COLOR = "#0f172a";
const AT_ROUND_COLOR = "#2f6fdf";

function nodeColor(node) { return NODE_COLORS[node % NODE_COLORS.length]; }

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
    if (i.recovered_round !== null && i.kind === INCIDENT.CRASH) {
      marks.push({ round: i.recovered_round, kind: NOTE.REJOIN, text: `node ${i.targets[0]} rejoined` });
    }
  }
  for (const e of model.events) {
    if (e.kind === EVENT.VIEW_CHANGE && e.round !== null) marks.push({ round: e.round, kind: EVENT.VIEW_CHANGE, text: e.detail });
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
  // A replay at the slider's round: the charts plot the run up to that round (the x axis keeps
  // the whole run, so where the round falls is seen), with the fault windows as they were then,
  // and a line at the round. Otherwise the whole run.
  const fleet = shownFleet();
  const at = ui.atRound;
  const all = [...model.rounds.values()].sort((a, b) => a.round - b.round);
  const rounds = at === null ? all : all.filter((r) => r.round <= at);
  const xs = rounds.map((r) => r.round);
  const x0 = all.length ? all[0].round : 0;
  const x1 = Math.max(x0 + 1, all.length ? all[all.length - 1].round : 0, model.fleet.fleet_round ?? 0);
  const marks = [...chartMarks(fleet), ...operatorMarks(at)];
  return { rounds, all, xs, x0, x1, marks, incidents: fleet.incidents, now: at ?? fleet.fleet_round, at };
}

function operatorMarks(at) {
  // Every command the operator sent from the page, at the fleet's round when it went out.
  const actions = model.fleet.operator_actions || [];
  return actions.filter((a) => a.round !== null && (at === null || a.round <= at)).map((a) => ({
    round: a.round, kind: OPERATOR_MARK, source: "operator",
    text: `operator: ${a.action} ${targetsText(a.targets)}${a.by ? ` by ${a.by}` : ""}${a.outcome ? ` (${a.outcome})` : ""}`,
  }));
}

function fleetLabel(id) {
  return id === "chart-time" ? `${ui.timeAgent} agent` : "fleet (mean of the nodes)";
}

function renderCharts() {
  const context = chartContext();
  ui.chartContext = context;
  refreshNodeSeries();
  renderNodePick();
  for (const [id, lastId, pick, fmt, yTitle, robust] of chartSeries()) {
    const ys = context.rounds.map((r) => { const v = pick(r); return v === null || v === undefined ? null : v; });
    const present = ys.filter((v) => v !== null);
    const specs = [{ label: fleetLabel(id), stroke: FLEET_STROKE }];
    const data = [context.xs, ys];
    // The y scale of the whole run: a replay's charts keep it as the slider moves.
    const all = context.at === null ? [...present]
      : context.all.map(pick).filter((v) => v !== null && v !== undefined);
    if (id === "chart-time") {
      // Each picked node's own round time beside the fleet's.
      for (const node of ui.nodes) {
        const values = nodeValues(node, context.xs, (p) => p.round_seconds);
        specs.push({ label: `node ${node}`, stroke: nodeColor(node), width: 1.5 });
        data.push(values);
        all.push(...values.filter((v) => v !== null));
      }
    }
    const chart = ensureChart(id, yTitle, id === "chart-accuracy", specs);
    chart.yRange = yRange(all, robust);
    chart.box.dataset.points = String(present.length);
    chart.box.dataset.nodes = ui.nodes.join(",");
    chart.box.querySelector(".axis-title.y").textContent = yTitle;
    chart.empty.hidden = present.length > 0;
    chart.plot.setData(data, false);
    applyZoom(chart.plot, context);
    let last = null;
    for (let k = ys.length - 1; k >= 0; k -= 1) if (ys[k] !== null) { last = [context.xs[k], ys[k]]; break; }
    document.getElementById(lastId).textContent = last ? `round ${last[0]}: ${fmt(last[1])}` : "";
  }
  renderNodeCharts(context);
  renderZoomBar(context);
}

// ------------------------------------------------------------------ per-node series

function nodeCharts() {
  // id, y title, value of a node's point (in the chart's unit), dashed second series
  return [
    ["chart-cpu", "CPU (% of one core)", 1, [["", (p) => p.cpu_percent]]],
    ["chart-rss", "resident memory (MB)", 1e6, [["", (p) => p.rss_bytes]]],
    ["chart-bytes", "bytes per round", 0, [[" sent", (p) => p.bytes_sent], [" received", (p) => p.bytes_received]]],
  ];
}

function renderNodeCharts(context) {
  const section = document.getElementById("node-charts");
  section.hidden = ui.nodes.length === 0;
  if (section.hidden) return;
  for (const [id, title, fixedScale, parts] of nodeCharts()) {
    const specs = [];
    const columns = [];
    for (const node of ui.nodes) {
      parts.forEach(([suffix, pick], k) => {
        specs.push({ label: `node ${node}${suffix}`, stroke: nodeColor(node), dash: k ? [5, 4] : undefined });
        columns.push(nodeValues(node, context.xs, pick));
      });
    }
    const present = columns.flat().filter((v) => v !== null);
    // Link bytes in the unit their size needs (a real model moves MB a round, a demo KB).
    const peak = present.length ? Math.max(...present) : 0;
    const scale = fixedScale || (peak >= 1e6 ? 1e6 : peak >= 1e3 ? 1e3 : 1);
    const yTitle = fixedScale ? title : `${title} (${{ 1: "B", 1e3: "KB", 1e6: "MB" }[scale]})`;
    const data = [context.xs, ...columns.map((col) => col.map((v) => (v === null ? null : v / scale)))];
    const chart = ensureChart(id, yTitle, false, specs);
    chart.yRange = yRange(present.map((v) => v / scale), false);
    if (chart.yRange[0] < 0 && present.every((v) => v >= 0)) chart.yRange[0] = 0;
    Object.assign(chart.box.dataset, { points: String(present.length), nodes: ui.nodes.join(","), scale: String(scale) });
    chart.box.querySelector(".axis-title.y").textContent = yTitle;
    chart.empty.textContent = ui.nodes.some((n) => nodeEntry(n).loading) ? "loading…" : "not reported by these nodes";
    chart.empty.hidden = present.length > 0;
    chart.plot.setData(data, false);
    applyZoom(chart.plot, context);
  }
}

function nodeEntry(node) {
  let entry = ui.nodeSeries.get(node);
  if (!entry) {
    entry = { points: new Map(), last: null, checked: null, loading: false, fetchedAt: 0, dropped: 0 };
    ui.nodeSeries.set(node, entry);
  }
  return entry;
}

function nodeValues(node, xs, pick) {
  const entry = ui.nodeSeries.get(node);
  return xs.map((x) => {
    const p = entry ? entry.points.get(x) : undefined;
    const v = p ? pick(p) : null;
    return v === null || v === undefined ? null : v;
  });
}

function refreshNodeSeries() {
  // A picked node's rounds: all of them once, then the new ones as the fleet moves on.
  const latest = model.fleet ? model.fleet.counters.latest_round : null;
  for (const node of ui.nodes) {
    const entry = nodeEntry(node);
    if (entry.loading) continue;
    if (entry.checked !== null && (latest === null || latest <= entry.checked
      || performance.now() - entry.fetchedAt < NODE_REFRESH_MS)) continue;
    fetchNodeSeries(node, latest);
  }
}

async function fetchNodeSeries(node, latest) {
  const entry = nodeEntry(node);
  entry.loading = true;
  try {
    for (;;) {
      const since = entry.last === null ? -1 : entry.last;
      const res = await fetch(`/api/nodes/${node}/series?since=${since}&limit=${NODE_PAGE}`);
      if (!res.ok) break; // 404: it has reported no round yet
      const page = await res.json();
      for (const p of page.points) entry.points.set(p.round, p);
      entry.dropped = page.dropped;
      if (page.points.length) entry.last = page.points[page.points.length - 1].round;
      if (page.points.length < NODE_PAGE) break;
    }
    entry.checked = latest ?? -1;
  } catch (err) {
    // The server went away for a moment: the next render asks again.
  } finally {
    entry.loading = false;
    entry.fetchedAt = performance.now();
    scheduleRender();
  }
}

function toggleNode(node) {
  const at = ui.nodes.indexOf(node);
  if (at >= 0) ui.nodes.splice(at, 1);
  else ui.nodes = [...ui.nodes, node].sort((a, b) => a - b);
  scheduleRender();
}

function renderNodePick() {
  // One toggle per node the fleet knows; a pressed one wears its series' colour.
  const pick = document.getElementById("node-pick");
  const ids = model.fleet ? model.fleet.nodes.map((n) => n.node) : [];
  const key = `${ids.join(",")}|${ui.nodes.join(",")}`;
  if (pick.dataset.key === key) return;
  pick.dataset.key = key;
  const buttons = ids.map((id) => {
    const button = html("button", "", String(id));
    button.type = "button";
    button.dataset.seriesNode = String(id);
    button.setAttribute("aria-pressed", ui.nodes.includes(id) ? "true" : "false");
    button.style.setProperty("--node-color", nodeColor(id));
    button.title = `node ${id}'s own series on the charts: round time, CPU, memory, link bytes`;
    return button;
  });
  pick.replaceChildren(pick.firstElementChild, ...buttons);
}

function applyZoom(plot, context) {
  // The whole run (to the fleet's round now), or the range the operator chose.
  const [lo, hi] = ui.zoom || [context.x0, context.x1];
  ui.settingScale = true;
  try { plot.setScale("x", { min: lo, max: hi }); } finally { ui.settingScale = false; }
}

function ensureChart(id, yTitle, percent, specs) {
  // specs: the chart's series ({label, stroke, width, dash}); other series, a new chart.
  const key = specs.map((spec) => spec.label).join("|");
  let existing = ui.charts[id];
  const box = document.getElementById(id);
  const width = Math.max(200, box.clientWidth - CHART_PAD.left);
  if (existing && existing.key !== key) {
    existing.plot.destroy();
    delete ui.charts[id];
    existing = null;
  }
  if (existing) {
    if (existing.plot.width !== width) existing.plot.setSize({ width, height: CHART_HEIGHT });
    return existing;
  }
  box.replaceChildren();
  const chart = { box, key, specs, yRange: [0, 1], overlay: null, empty: null, plot: null };
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
    series: [{}, ...specs.map((spec) => ({ label: spec.label, stroke: spec.stroke, width: spec.width || 2,
      dash: spec.dash, spanGaps: true,
      points: { show: (u) => u.data[0].length <= 400, size: spec.width ? 4 : 5, fill: spec.stroke } }))],
    hooks: {
      draw: [(u) => drawOverlay(chart, u)],
      setScale: [(u, key) => { if (key === "x") zoomed(u); }],
      setCursor: [(u) => cursorMoved(chart, u)],
    },
  };
  chart.plot = new uPlot(opts, [[], ...specs.map(() => [])], box);
  chart.overlay = html("div", "chart-overlay");
  chart.plot.over.appendChild(chart.overlay);
  box.append(yTitleEl, xTitleEl, chart.empty);
  if (!box.dataset.hover) { // once per box: a chart rebuilt for other series keeps them
    box.dataset.hover = "true";
    box.addEventListener("mouseenter", () => { ui.hoverChart = id; });
    box.addEventListener("mouseleave", () => { if (ui.hoverChart === id) ui.hoverChart = null; hideTip(); });
  }
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
    const line = html("div", mark.source === "operator" ? "mark operator" : "mark");
    Object.assign(line.dataset, { kind: mark.kind, round: mark.round, source: mark.source || "" });
    line.style.left = `${pos(mark.round)}px`;
    line.style.setProperty("--mark", mark.source === "operator" ? OPERATOR_COLOR : MARK_COLORS[mark.kind] || COLORS.unknown);
    line.title = `round ${mark.round}: ${mark.text}`;
    nodes.push(line);
  }
  if (context.at !== null && context.at >= min && context.at <= max) {
    // The replay's round: where the slider is, on every chart.
    const line = html("div", "at-round");
    line.dataset.round = String(context.at);
    line.style.left = `${pos(context.at)}px`;
    line.title = `replay at round ${context.at}`;
    nodes.push(line);
  }
  chart.box.dataset.atRound = context.at === null ? "" : String(context.at);
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
    + (active.length ? ` · faults: ${active.join(", ")}` : "")
    + ui.nodes.map((n) => nodeTipText(n, round)).join("");
  tip.hidden = false;
  const over = ui.charts[box.id].plot.over.getBoundingClientRect();
  const x = over.left + left;
  const pageLeft = Math.min(x + 12, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = `${Math.max(4, pageLeft) + window.scrollX}px`;
  tip.style.top = `${over.bottom + 4 + window.scrollY}px`;
}

function nodeTipText(node, round) {
  const p = nodeEntry(node).points.get(round);
  if (!p) return ` · node ${node}: no report`;
  return ` · node ${node}: ${fmtSeconds(p.round_seconds)}, CPU ${p.cpu_percent === null ? "–" : `${p.cpu_percent.toFixed(0)} %`}, `
    + `RSS ${p.rss_bytes === null ? "–" : fmtBytes(p.rss_bytes)}, sent ${fmtBytes(p.bytes_sent)}, received ${fmtBytes(p.bytes_received)}`;
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
  const nodeFields = ["round_seconds", "cpu_percent", "rss_bytes", "bytes_sent", "bytes_received"];
  for (const node of ui.nodes) head.push(...nodeFields.map((f) => `node${node}_${f}`)); // the picked nodes' own
  const cell = (v) => (v === null || v === undefined ? "" : String(v));
  const rows = [...model.rounds.values()].filter((r) => r.round >= lo && r.round <= hi)
    .sort((a, b) => a.round - b.round)
    .map((r) => [r.round, r.epoch, r.loss, r.accuracy, r.round_seconds_median, r.round_seconds,
      r.reports, r.members, r.degraded, r.missing_chunks, r.reroutes, r.timeouts, r.bytes_sent,
      ...ui.nodes.flatMap((n) => { const p = nodeEntry(n).points.get(r.round); return nodeFields.map((f) => (p ? p[f] : null)); }),
    ].map(cell).join(","));
  return [head.join(","), ...rows].join("\n") + "\n";
}

function download(blob, name) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function exportCsv() {
  const job = model.fleet ? model.fleet.job : "fleet";
  download(new Blob([roundsCsv()], { type: "text/csv" }),
    ui.zoom ? `${job}-rounds-${ui.zoom[0]}-${ui.zoom[1]}.csv` : `${job}-rounds.csv`);
}

// ------------------------------------------------------------------ PNG export

function chartImage(id) {
  // The chart as one image: its title, uPlot's canvas (plot, axes, ticks), the DOM overlays'
  // essentials (fault windows, marks, off-scale points), the axis titles and a legend.
  const chart = ui.charts[id];
  const u = chart.plot;
  const src = u.ctx.canvas;
  const r = src.width / u.width || 1; // the canvas's pixels per CSS pixel
  const card = chart.box.closest(".card");
  const title = card ? card.querySelector("h2").textContent : id;
  const job = model.fleet ? model.fleet.job : "fleet";
  const { min, max } = u.scales.x;
  const subtitle = `job ${job} · rounds ${Math.round(min)}–${Math.round(max)}`;
  const font = (px, weight = 400) => `${weight} ${px * r}px system-ui, -apple-system, "Segoe UI", sans-serif`;
  const m = 12 * r;
  const left = m + 16 * r;
  const top = m + 40 * r;
  const legendItems = chart.specs.map((spec) => spec);
  const probe = document.createElement("canvas").getContext("2d");
  probe.font = font(11);
  const widths = legendItems.map((spec) => 22 * r + probe.measureText(spec.label).width + 14 * r);
  const rows = [];
  let row = [];
  let used = 0;
  widths.forEach((w, k) => {
    if (row.length && used + w > src.width) { rows.push(row); row = []; used = 0; }
    row.push(k);
    used += w;
  });
  if (row.length) rows.push(row);
  const out = document.createElement("canvas");
  out.width = left + src.width + m;
  out.height = top + src.height + 22 * r + rows.length * 18 * r + m;
  const ctx = out.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, out.width, out.height);
  ctx.textBaseline = "top";
  ctx.fillStyle = "#16202e";
  ctx.font = font(15, 600);
  ctx.fillText(title, m, m);
  ctx.fillStyle = "#6b7280";
  ctx.font = font(11);
  ctx.fillText(subtitle, m, m + 21 * r);
  ctx.drawImage(src, left, top);
  // The overlays, placed as on the page: their CSS pixels from the plot area's corner.
  const bb = u.bbox;
  const px = (el) => parseFloat(el.style.left || "0") * r;
  for (const el of chart.overlay.children) {
    const style = getComputedStyle(el);
    const x = left + bb.left + px(el);
    if (el.classList.contains("incident-band")) {
      ctx.globalAlpha = Number(style.opacity) || 0.16;
      ctx.fillStyle = style.backgroundColor;
      ctx.fillRect(x, top + bb.top, Math.max(2 * r, parseFloat(el.style.width || "0") * r), bb.height);
      ctx.globalAlpha = 1;
    } else if (el.classList.contains("mark") || el.classList.contains("at-round")) {
      ctx.strokeStyle = el.classList.contains("at-round") ? AT_ROUND_COLOR : el.style.getPropertyValue("--mark") || "#b8c0cc";
      ctx.lineWidth = 1.5 * r;
      ctx.setLineDash([4 * r, 3 * r]);
      ctx.beginPath();
      ctx.moveTo(x, top + bb.top);
      ctx.lineTo(x, top + bb.top + bb.height);
      ctx.stroke();
      ctx.setLineDash([]);
    } else if (el.classList.contains("clipped")) {
      ctx.fillStyle = style.backgroundColor;
      ctx.beginPath();
      ctx.arc(x, top + bb.top + 3.5 * r, 3.5 * r, 0, 2 * Math.PI);
      ctx.fill();
    }
  }
  ctx.fillStyle = "#6b7280";
  ctx.font = font(10.5);
  const yTitle = chart.box.querySelector(".axis-title.y").textContent;
  ctx.save();
  ctx.translate(m, top + bb.top + bb.height / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText(yTitle, 0, 0);
  ctx.restore();
  ctx.textAlign = "center";
  ctx.fillText("round", left + bb.left + bb.width / 2, top + src.height + 4 * r);
  ctx.textAlign = "left";
  ctx.font = font(11);
  rows.forEach((items, line) => {
    let x = left;
    const y = top + src.height + 22 * r + line * 18 * r;
    for (const k of items) {
      const spec = legendItems[k];
      ctx.strokeStyle = spec.stroke;
      ctx.lineWidth = 2.5 * r;
      ctx.setLineDash(spec.dash ? spec.dash.map((d) => d * r) : []);
      ctx.beginPath();
      ctx.moveTo(x, y + 6 * r);
      ctx.lineTo(x + 16 * r, y + 6 * r);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = "#16202e";
      ctx.fillText(spec.label, x + 22 * r, y);
      x += widths[k];
    }
  });
  return out;
}

function exportPng(id) {
  if (!ui.charts[id]) return;
  const job = model.fleet ? model.fleet.job : "fleet";
  const range = ui.zoom ? `-rounds-${ui.zoom[0]}-${ui.zoom[1]}` : "";
  chartImage(id).toBlob((blob) => { if (blob) download(blob, `${job}-${id.replace(/^chart-/, "")}${range}.png`); }, "image/png");
}
