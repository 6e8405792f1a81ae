// Edgegrove dashboard page: one WebSocket, hand-written SVG, no dependencies.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = {
  ok: "#2e9e5b", suspected: "#e0a100", failed: "#d63b3b", rerouted: "#7b4fd6", unknown: "#b8c0cc",
  online: "#2e9e5b", joining: "#3a7bd5", rejoining: "#13a3b5", hung: "#e46a17", offline: "#6b7280",
};
// Events that mark the charts' time axis, and the colour of their marker.
const MARKERS = {
  crash: "#d63b3b", offline: "#d63b3b", link_failed: "#d63b3b", hung: "#e46a17",
  link_rerouted: "#7b4fd6", degraded: "#e0a100",
  rejoin: "#13a3b5", view_change: "#3a7bd5",
};
const MARKER_GROUPS = [
  ["failure", "#d63b3b"], ["reroute", "#7b4fd6"], ["degraded", "#e0a100"],
  ["rejoin", "#13a3b5"], ["view change", "#3a7bd5"],
];
const EVENT_BADGE = {
  crash: "failed", offline: "offline", link_failed: "failed", timeout: "suspected",
  link_suspected: "suspected", suspected: "suspected", hung: "hung", reroute: "rerouted",
  link_rerouted: "rerouted", degraded: "suspected", rejoin: "rejoining", join: "joining",
  view_change: "joining", link_ok: "ok", recovered: "ok", resync: "rejoining", pull: "rerouted",
  nack: "suspected", link_dead: "failed", link_healed: "ok",
};
const MAX_EVENTS_SHOWN = 300;

const model = { fleet: null, rounds: new Map(), events: [] };
let socket = null;
let retryDelay = 500;
let renderPending = false;

function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function fmtNum(v, digits = 3) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

// ------------------------------------------------------------------ connection

function connect() {
  const proto = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${proto}://${location.host}/ws`);
  socket.onopen = () => { retryDelay = 500; setPill("ws-pill", true, "live"); };
  socket.onmessage = (msg) => { ingest(JSON.parse(msg.data)); };
  socket.onclose = () => {
    setPill("ws-pill", false, "reconnecting…");
    setTimeout(connect, retryDelay);
    retryDelay = Math.min(retryDelay * 2, 5000);
  };
  socket.onerror = () => socket.close();
}

function ingest(msg) {
  if (msg.full) { model.rounds.clear(); model.events = []; }
  for (const r of msg.rounds) model.rounds.set(r.round, r);
  if (msg.events.length) {
    model.events = model.events.concat(msg.events).slice(-MAX_EVENTS_SHOWN * 4);
  }
  model.fleet = msg.fleet;
  if (!renderPending) {
    renderPending = true;
    requestAnimationFrame(() => { renderPending = false; render(); });
  }
}

function setPill(id, ok, text) {
  const pill = document.getElementById(id);
  pill.dataset.ok = ok ? "true" : "false";
  pill.textContent = text;
}

// ------------------------------------------------------------------ rendering

function render() {
  const fleet = model.fleet;
  if (!fleet) return;
  document.getElementById("job").textContent = fleet.job;
  setPill("broker-pill", fleet.broker.connected,
    fleet.broker.connected ? "broker connected" : `broker: ${fleet.broker.last_error || "disconnected"}`);
  const view = fleet.view;
  document.getElementById("view-pill").textContent = view
    ? `epoch ${view.epoch} · ${view.members.length} members · arity ${view.arity}` : "no view yet";
  renderCounters(fleet);
  renderTree(fleet);
  renderEvents();
  renderCharts();
  renderNodes(fleet);
  renderControls(fleet);
}

function renderCounters(fleet) {
  const c = fleet.counters;
  const online = fleet.nodes.filter((n) => ["online", "joining", "rejoining"].includes(n.state)).length;
  const items = [
    ["nodes up", `${online} / ${fleet.nodes.length}`, online < fleet.nodes.length],
    ["round", c.latest_round ?? "–", false],
    ["rounds seen", c.rounds, false],
    ["bytes sent", fmtBytes(c.bytes_sent), false],
    ["reroutes", c.reroutes, c.reroutes > 0],
    ["timeouts", c.timeouts, c.timeouts > 0],
    ["degraded rounds", c.degraded_rounds, c.degraded_rounds > 0],
    ["rejected frames", c.rejected_total, c.rejected_total > 0],
    ["ignored messages", c.malformed_total, c.malformed_total > 0],
  ];
  const box = document.getElementById("counters");
  box.replaceChildren(...items.map(([label, value, alert]) => {
    const div = document.createElement("div");
    div.className = "counter";
    div.dataset.alert = alert ? "true" : "false";
    div.dataset.counter = label;
    div.innerHTML = `<div class="label"></div><div class="value"></div>`;
    div.firstChild.textContent = label;
    div.lastChild.textContent = value;
    return div;
  }));
}

function renderLegend() {
  const legend = document.getElementById("legend");
  const parts = [];
  for (const s of ["online", "joining", "rejoining", "hung", "offline"]) {
    parts.push(`<span class="item"><span class="dot" style="background:${COLORS[s]}"></span>${s}</span>`);
  }
  parts.push(`<span class="sep"></span>`);
  for (const s of ["ok", "suspected", "failed", "rerouted"]) {
    parts.push(`<span class="item"><span class="bar" style="background:${COLORS[s]}"></span>${s}</span>`);
  }
  parts.push(`<span class="item"><span class="bar" style="background:repeating-linear-gradient(90deg,#9aa4b2 0 4px,transparent 4px 7px)"></span>backup</span>`);
  legend.innerHTML = parts.join("");
  const markers = document.getElementById("marker-legend");
  markers.innerHTML = "<span>chart markers:</span>" + MARKER_GROUPS.map(([name, color]) =>
    `<span class="item"><span class="bar" style="background:${color}"></span>${name}</span>`).join("");
}

function treeLayout(fleet, width, height) {
  // Heap-order k-ary tree: level d holds positions k^d-1 .. ; spread each level evenly.
  const pos = new Map();
  const view = fleet.view;
  const inView = view ? view.members : [];
  const k = view ? view.arity : 2;
  const outside = fleet.nodes.filter((n) => !inView.includes(n.node)).map((n) => n.node);
  let levels = 0;
  for (let count = 0, width_ = 1; count < inView.length; count += width_, width_ *= k) levels += 1;
  const bottom = outside.length ? height - 80 : height - 40;
  const levelGap = levels > 1 ? (bottom - 34) / (levels - 1) : 0;
  let start = 0;
  for (let d = 0, slots = 1; start < inView.length; d += 1, slots *= k) {
    for (let i = 0; i < slots && start + i < inView.length; i += 1) {
      pos.set(inView[start + i], { x: ((i + 0.5) / slots) * width, y: 34 + d * levelGap });
    }
    start += slots;
  }
  outside.forEach((node, i) => {
    pos.set(node, { x: 40 + i * 44, y: height - 22, outside: true });
  });
  return pos;
}

function renderTree(fleet) {
  const svg = document.getElementById("tree");
  const width = svg.clientWidth || 700;
  const height = svg.clientHeight || 360;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  clear(svg);
  const pos = treeLayout(fleet, width, height);
  const n = Math.max(1, fleet.view ? fleet.view.members.length : fleet.nodes.length);
  const radius = Math.max(10, Math.min(18, (width / n) * 0.32));
  const linkLayer = el("g", { class: "links" }, svg);
  for (const link of fleet.links) {
    const a = pos.get(link.a);
    const b = pos.get(link.b);
    if (!a || !b) continue;
    const healthy = link.state === "ok" || link.state === "unknown";
    const attrs = {
      class: "link", "data-a": link.a, "data-b": link.b, "data-state": link.state,
      "data-kind": link.kind, stroke: COLORS[link.state] || COLORS.unknown,
    };
    let shape;
    if (link.kind === "tree") {
      shape = el("line", { ...attrs, x1: a.x, y1: a.y, x2: b.x, y2: b.y, "stroke-width": healthy ? 2.5 : 4 }, linkLayer);
    } else {
      // Backup links bow upwards between siblings/uncles so they do not hide tree links.
      const mx = (a.x + b.x) / 2;
      const my = Math.min(a.y, b.y) - 26 - Math.abs(a.x - b.x) * 0.08;
      shape = el("path", {
        ...attrs, d: `M ${a.x} ${a.y} Q ${mx} ${my} ${b.x} ${b.y}`,
        "stroke-width": healthy ? 1.4 : 3, "stroke-dasharray": "5 4",
        stroke: healthy ? "#b5bdc9" : COLORS[link.state],
      }, linkLayer);
    }
    el("title", {}, shape).textContent = `${link.kind} link ${link.a}–${link.b}: ${link.state}`;
  }
  const outsideCount = fleet.nodes.filter((x) => pos.get(x.node)?.outside).length;
  if (outsideCount) {
    const label = el("text", { class: "outside-label", x: 16, y: height - 48 }, svg);
    label.textContent = "outside the current view";
  }
  const nodeLayer = el("g", { class: "nodes" }, svg);
  for (const node of fleet.nodes) {
    const p = pos.get(node.node);
    if (!p) continue;
    const g = el("g", {
      class: "node", "data-node": node.node, "data-state": node.state,
      transform: `translate(${p.x},${p.y})`,
    }, nodeLayer);
    const r = p.outside ? 13 : radius;
    el("circle", { r, fill: COLORS[node.state] || COLORS.unknown }, g);
    el("text", {}, g).textContent = node.node;
    if (!p.outside && radius >= 14) {
      el("text", { class: "sub", y: r + 11 }, g).textContent = node.last_round !== null ? `r${node.last_round}` : "";
    }
    el("title", {}, g).textContent =
      `node ${node.node}: ${node.state}` + (node.last_round !== null ? `, round ${node.last_round}` : "")
      + (node.seconds_silent !== null ? `, silent ${node.seconds_silent.toFixed(1)} s` : "");
  }
}

function groupEvents(events) {
  // A link that stays cut repeats the same timeout/reroute every round: show it once, with a
  // count and the round range, instead of flooding the timeline.
  const groups = [];
  for (const e of events) {
    const key = `${e.kind}|${e.node}|${e.peer}|${e.detail}`;
    let merged = false;
    for (let i = groups.length - 1; i >= Math.max(0, groups.length - 16); i -= 1) {
      const g = groups[i];
      if (g.key === key && e.round !== null && g.last.round !== null && e.round - g.last.round <= 2) {
        g.count += 1;
        g.last = e;
        groups.splice(i, 1);
        groups.push(g);
        merged = true;
        break;
      }
    }
    if (!merged) groups.push({ key, first: e, last: e, count: 1 });
  }
  return groups;
}

function renderEvents() {
  const list = document.getElementById("events");
  const groups = groupEvents(model.events).slice(-MAX_EVENTS_SHOWN).reverse();
  document.getElementById("event-count").textContent =
    model.fleet ? `${model.fleet.counters.events} events` : "";
  list.replaceChildren(...groups.map((g) => {
    const e = g.last;
    const li = document.createElement("li");
    li.dataset.kind = e.kind;
    const when = new Date(e.time * 1000).toLocaleTimeString([], { hour12: false });
    const badge = COLORS[EVENT_BADGE[e.kind]] || COLORS.unknown;
    const rounds = g.count > 1 && g.first.round !== e.round ? `r${g.first.round}–${e.round}` : `r${e.round}`;
    const who = [e.round !== null ? rounds : "", e.node !== null ? `node ${e.node}` : "",
      e.peer !== null ? `→ ${e.peer}` : ""].filter(Boolean).join(" ");
    const times = g.count > 1 ? ` (×${g.count})` : "";
    li.innerHTML = `<span class="when"></span><span><span class="badge"></span></span><span class="what"></span>`;
    li.children[0].textContent = when;
    li.children[1].firstChild.textContent = e.kind.replace(/_/g, " ");
    li.children[1].firstChild.style.background = badge;
    li.children[2].textContent = `${who}${who && e.detail ? " · " : ""}${e.detail}${times}`;
    return li;
  }));
}

function eventMarkers() {
  const byRound = new Map();
  for (const e of model.events) {
    if (e.round === null || !(e.kind in MARKERS)) continue;
    if (!byRound.has(e.round)) byRound.set(e.round, { kinds: new Set(), color: MARKERS[e.kind] });
    byRound.get(e.round).kinds.add(e.kind);
  }
  return byRound;
}

function renderCharts() {
  const rounds = [...model.rounds.values()].sort((a, b) => a.round - b.round);
  const markers = eventMarkers();
  const series = [
    ["chart-loss", "loss-last", (r) => r.loss, (v) => v.toFixed(3)],
    ["chart-accuracy", "accuracy-last", (r) => r.accuracy, (v) => `${(v * 100).toFixed(1)}%`],
    ["chart-time", "time-last", (r) => (r.round_seconds > 0 ? r.round_seconds : null), (v) => `${v.toFixed(2)} s`],
  ];
  for (const [id, lastId, pick, fmt] of series) {
    const points = rounds.filter((r) => pick(r) !== null).map((r) => [r.round, pick(r)]);
    drawChart(document.getElementById(id), points, markers, rounds);
    const last = points.length ? points[points.length - 1] : null;
    document.getElementById(lastId).textContent = last ? `round ${last[0]}: ${fmt(last[1])}` : "";
  }
}

function niceTicks(lo, hi, count) {
  const span = hi - lo || 1;
  const step0 = span / count;
  const mag = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || step0;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) ticks.push(t);
  return ticks;
}

function drawChart(svg, points, markers, rounds) {
  const width = svg.clientWidth || 360;
  const height = svg.clientHeight || 190;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  clear(svg);
  const m = { l: 44, r: 10, t: 10, b: 24 };
  if (!points.length) {
    el("text", { class: "empty", x: width / 2, y: height / 2 }, svg).textContent = "no data yet";
    return;
  }
  const xs = rounds.map((r) => r.round);
  const x0 = Math.min(...xs);
  const x1 = Math.max(x0 + 1, ...xs);
  let y0 = Math.min(...points.map((p) => p[1]));
  let y1 = Math.max(...points.map((p) => p[1]));
  if (y1 - y0 < 1e-9) { y0 -= 0.5 * (Math.abs(y0) || 1); y1 += 0.5 * (Math.abs(y1) || 1); }
  const pad = (y1 - y0) * 0.08;
  y0 -= pad; y1 += pad;
  const sx = (x) => m.l + ((x - x0) / (x1 - x0)) * (width - m.l - m.r);
  const sy = (y) => height - m.b - ((y - y0) / (y1 - y0)) * (height - m.t - m.b);
  for (const t of niceTicks(y0, y1, 4)) {
    el("line", { class: "grid", x1: m.l, x2: width - m.r, y1: sy(t), y2: sy(t) }, svg);
    const label = el("text", { class: "tick", x: m.l - 6, y: sy(t) + 3, "text-anchor": "end" }, svg);
    label.textContent = Math.abs(t) >= 100 ? t.toFixed(0) : +t.toPrecision(3);
  }
  for (const t of niceTicks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
    const label = el("text", { class: "tick", x: sx(t), y: height - 8, "text-anchor": "middle" }, svg);
    label.textContent = t;
  }
  el("line", { class: "axis", x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b }, svg);
  for (const [round, marker] of markers) {
    if (round < x0 || round > x1) continue;
    const line = el("line", {
      class: "marker", "data-round": round, x1: sx(round), x2: sx(round), y1: m.t, y2: height - m.b,
      stroke: marker.color, "stroke-width": 1.5, "stroke-dasharray": "3 3", opacity: 0.85,
    }, svg);
    el("title", {}, line).textContent = `round ${round}: ${[...marker.kinds].join(", ")}`;
    el("path", { d: `M ${sx(round) - 4} ${m.t} L ${sx(round) + 4} ${m.t} L ${sx(round)} ${m.t + 6} Z`, fill: marker.color }, svg);
  }
  el("polyline", { class: "series", points: points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" ") }, svg);
  const dense = points.length > 80;
  for (const [x, y] of points) {
    const dot = el("circle", { class: "point", cx: sx(x), cy: sy(y), r: dense ? 1.6 : 2.8, "data-round": x }, svg);
    el("title", {}, dot).textContent = `round ${x}: ${+y.toPrecision(4)}`;
  }
}

function renderNodes(fleet) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...fleet.nodes.map((n) => {
    const tr = document.createElement("tr");
    tr.dataset.node = n.node;
    const cells = [
      n.node, null, n.last_round ?? "–",
      n.seconds_silent === null ? "–" : `${n.seconds_silent.toFixed(1)} s`,
      fmtNum(n.loss), n.accuracy === null ? "–" : `${(n.accuracy * 100).toFixed(1)}%`,
      fmtBytes(n.bytes_sent), n.reroutes, n.model_hash ? n.model_hash.slice(0, 10) : "–", n.incarnation,
    ];
    cells.forEach((value, i) => {
      const td = document.createElement("td");
      if (i === 1) {
        const badge = document.createElement("span");
        badge.className = "badge";
        badge.style.background = COLORS[n.state] || COLORS.unknown;
        badge.textContent = n.state;
        td.appendChild(badge);
      } else {
        td.textContent = value;
      }
      if (i === 8) td.className = "mono";
      tr.appendChild(td);
    });
    return tr;
  }));
}

function renderControls(fleet) {
  const card = document.getElementById("controls");
  card.hidden = !fleet.controls_enabled;
  card.parentElement.classList.toggle("single", !fleet.controls_enabled);
}

async function sendControl(event) {
  event.preventDefault();
  const token = document.getElementById("control-token").value;
  sessionStorage.setItem("edgegrove-token", token);
  const value = (id) => document.getElementById(id).value;
  const body = { action: value("control-action"), node: Number(value("control-node")) };
  if (value("control-peer") !== "") body.peer = Number(value("control-peer"));
  if (value("control-value") !== "") body.value = Number(value("control-value"));
  const result = document.getElementById("control-result");
  try {
    const response = await fetch("/api/control", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
    });
    const data = await response.json();
    result.textContent = response.ok ? `sent ${body.action} to ${data.topic}` : `refused: ${JSON.stringify(data.detail)}`;
  } catch (err) {
    result.textContent = `failed: ${err}`;
  }
}

window.addEventListener("resize", () => render());
document.getElementById("control-form").addEventListener("submit", sendControl);
document.getElementById("control-token").value = sessionStorage.getItem("edgegrove-token") || "";
renderLegend();
connect();
