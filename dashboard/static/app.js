// Edgegrove dashboard page: one WebSocket; the tree in SVG, the charts on uPlot (charts.js).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = {
  ok: "#2e9e5b", suspected: "#e0a100", failed: "#d63b3b", rerouted: "#7b4fd6", unknown: "#b8c0cc",
  online: "#2e9e5b", joining: "#3a7bd5", rejoining: "#13a3b5", hung: "#e46a17", evicted: "#a4262c", offline: "#6b7280",
};
// Every kind, and each table keyed by kinds, comes from /kinds.js (dashboard/kinds.py).
const { note: NOTE, event: EVENT, incident: INCIDENT } = KINDS;
// One colour per fault kind: its window's shading on the charts, its incident, its marks.
const FAULT_COLORS = KINDS.faultColors;
// One colour per label in a node's label bar (tab10, as the report's labels.png).
const LABEL_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const MARK_COLORS = { ...FAULT_COLORS, ...KINDS.markColors };
const BRIDGE_COLORS = { up: "#2e9e5b", down: "#d63b3b", unknown: "#b8c0cc" };
const EVENT_BADGE = KINDS.badge; // an event kind -> the COLORS entry of its badge
// Who made an incident, in the operator's words.
const SOURCE_TEXT = { injected: "injected by the scenario", operator: "made by the operator", detected: "seen by the fleet" };
// Timeline filters. Chatty per-chunk kinds are collapsed into one row with a count.
const FILTERS = Object.fromEntries(Object.entries(KINDS.filters).map(([name, kinds]) => [name, new Set(kinds)]));
const CHATTY = new Set(KINDS.chatty);
const MAX_EVENTS_KEPT = 200000; // the whole history of a long run; earlier pages load on request
const EARLIER_PAGE = 5000;
const EARLIER_ROUNDS_PAGE = 5000;
const MAX_ROWS_SHOWN = 300;
const CONFIRM_ACTIONS = new Set(["crash", "hang", "isolate", "broker_restart"]);
const NEEDS_PEER = new Set(["cut", "heal"]);
const NEEDS_VALUE = new Set(["loss", "latency", "broker_restart"]);
const NO_NODE = new Set(["broker_restart"]); // the whole broker, not a node
const OUTCOME_WAIT_MS = 8000;
const LOG_LINES = 200;

const model = { fleet: null, rounds: new Map(), events: [], atFleet: null };
// atRound: the replay slider's round (null: the end of the run, or live).
const ui = { me: null, atLoading: false, loadingRounds: false, zoom: null, chartContext: null, hoverChart: null, settingScale: false, filter: "faults", timeAgent: "median", pending: null, charts: {}, atRound: null, atAsked: 0, nodes: [], nodeSeries: new Map() };
let socket = null;
let retryDelay = 500;
let renderPending = false;

function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== "") node.textContent = text;
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
// One convention for percentages everywhere: accuracy as "92.6 %".
function fmtPct(v) { return v === null || v === undefined ? "–" : `${(v * 100).toFixed(1)} %`; }
function fmtSeconds(v) { return v === null || v === undefined ? "–" : `${v.toFixed(v < 10 ? 2 : 1)} s`; }
function targetsText(t) { return t.length === 2 ? `link ${t[0]}–${t[1]}` : t.length ? `node ${t[0]}` : "the broker"; }

// ------------------------------------------------------------------ connection

function connect() {
  const proto = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${proto}://${location.host}/ws`);
  socket.onopen = () => { retryDelay = 500; renderConnection(true); };
  socket.onmessage = (msg) => { ingest(JSON.parse(msg.data)); };
  socket.onclose = () => {
    // A finished run's dashboard goes away for good: say so instead of reconnecting forever.
    if (runOver()) { renderConnection(false); return; }
    setPill("ws-pill", false, "reconnecting…");
    setTimeout(connect, retryDelay);
    retryDelay = Math.min(retryDelay * 2, 5000);
  };
  socket.onerror = () => socket.close();
}

function runOver() { return Boolean(model.fleet) && model.fleet.run.phase !== "live"; }

function ingest(msg) {
  if (msg.full) { model.rounds.clear(); model.events = []; }
  for (const r of msg.rounds) model.rounds.set(r.round, r);
  if (msg.events.length) model.events = model.events.concat(msg.events).slice(-MAX_EVENTS_KEPT);
  model.fleet = msg.fleet;
  // A replay's charts show the whole run at once: its earlier rounds come by REST.
  if (msg.full && msg.fleet.run.replay_of) loadEarlierRounds(true);
  scheduleRender();
}

function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => { renderPending = false; render(); });
}

function setPill(id, ok, text) {
  const pill = document.getElementById(id);
  pill.dataset.ok = ok ? "true" : "false";
  pill.textContent = text;
}

function renderConnection(open) {
  const run = model.fleet ? model.fleet.run : null;
  const banner = document.getElementById("run-banner");
  if (run && run.replay_of) {
    setPill("ws-pill", true, "replay");
    banner.hidden = false;
    banner.dataset.kind = "replay";
    banner.textContent = `Replay of the finished run ${run.replay_of}`;
  } else if (run && run.phase !== "live") {
    // The page keeps the run's last live state; it says the run is over, not an outage.
    setPill("ws-pill", false, "run finished");
    document.getElementById("ws-pill").dataset.ok = "finished";
    banner.hidden = false;
    banner.dataset.kind = "finished";
    banner.textContent = `Run finished: the last live state of the run is shown${open ? "" : "; this dashboard has stopped"}. `
      + (run.replay_hint ? `Open the run again with: ${run.replay_hint}` : "");
  } else {
    setPill("ws-pill", open, open ? "live" : "reconnecting…");
    banner.hidden = true;
  }
}

// ------------------------------------------------------------------ rendering

// The fleet the page shows: a replay's state at the slider's round, else the latest.
function shownFleet() { return ui.atRound !== null && model.atFleet ? model.atFleet : model.fleet; }

function render() {
  const fleet = shownFleet();
  if (!fleet) return;
  const latest = model.fleet; // the run as a whole: its phase, its broker, its controls
  renderReplayBar(latest);
  document.getElementById("job").textContent = latest.job;
  const replay = Boolean(latest.run.replay_of);
  const finished = latest.run.phase !== "live";
  setPill("broker-pill", latest.broker.connected || replay,
    replay ? "recorded run" : finished ? "run finished" : latest.broker.connected ? "broker connected"
      : `broker: ${latest.broker.last_error || "disconnected"}`);
  // A finished run's broker is no evidence of anything: neutral, not green.
  if (finished) document.getElementById("broker-pill").dataset.ok = "finished";
  const view = fleet.view;
  document.getElementById("view-pill").textContent = view
    ? `epoch ${view.epoch} · ${view.members.length} members` : "no view yet";
  renderConnection(socket !== null && socket.readyState === WebSocket.OPEN);
  renderIncidents(fleet);
  renderCounters(fleet);
  renderTree(fleet);
  renderEvents();
  renderCharts();
  renderRoundsNote();
  renderSites(fleet);
  renderNodes(fleet);
  renderLogPicker(latest);
  renderControls(latest);
}

function recoveryText(i) {
  if (i.recovered_round !== null) return `recovered at round ${i.recovered_round} (back in the view with the fleet's model hash)`;
  const undone = i.healed_round !== null ? `undone at round ${i.healed_round}, ` : "";
  return i.active ? `${undone}no recovery yet` : `${undone}no recovery seen before the run ended`;
}

function renderIncidentHistory(fleet) {
  const box = document.getElementById("incident-history");
  const rows = fleet.incidents.map((i) => {
    const li = html("li", "", `r${i.start_round ?? "?"} ${i.kind} · ${targetsText(i.targets)} · `
      + `${SOURCE_TEXT[i.source] || i.source} · ${recoveryText(i)}`);
    Object.assign(li.dataset, { kind: i.kind, targets: i.targets.join("-"), source: i.source,
      recovered: i.recovered_round ?? "" });
    return li;
  });
  box.hidden = !rows.length;
  box.querySelector("summary").textContent = `all ${rows.length} incidents of this run`;
  box.querySelector("ol").replaceChildren(...rows);
}

function renderIncidents(fleet) {
  const active = fleet.incidents.filter((i) => i.active);
  document.getElementById("incident-count").textContent =
    `${active.length} active · ${fleet.incidents.length} in this run`;
  renderIncidentHistory(fleet);
  const list = document.getElementById("incidents");
  if (!active.length) {
    list.replaceChildren(html("li", "none", "No active incidents."));
    return;
  }
  list.replaceChildren(...active.map((i) => {
    const li = html("li");
    Object.assign(li.dataset, { incident: i.id, kind: i.kind, targets: i.targets.join("-"),
      source: i.source, start: i.start_round ?? "" });
    li.style.borderLeftColor = FAULT_COLORS[i.kind] || COLORS.failed;
    const head = html("div", "head");
    head.append(html("strong", "", `${i.kind} · ${targetsText(i.targets)}`),
      html("span", "muted", ` since round ${i.start_round ?? "?"} · ${SOURCE_TEXT[i.source] || i.source}`
        + (i.source === "detected" ? "" : i.detected_round !== null ? ` · the fleet saw it at round ${i.detected_round}`
          : " · not yet seen by the fleet")));
    const recovery = html("div", "recovery", recoveryText(i));
    recovery.dataset.recovered = i.recovered_round !== null ? "true" : "false";
    li.append(head, html("div", "title", i.title), recovery);
    if (i.evidence.length) li.append(html("div", "evidence muted", i.evidence.slice(-2).join(" · ")));
    return li;
  }));
}

function renderCounters(fleet) {
  const c = fleet.counters;
  const up = fleet.nodes.filter((n) => ["online", "joining", "rejoining"].includes(n.state)).length;
  const rejected = Object.entries(c.rejected_frames).sort((a, b) => b[1] - a[1]);
  const items = [
    ["nodes up", `${up} / ${fleet.nodes.length}`, up < fleet.nodes.length && fleet.run.phase === "live", ""],
    ["round", fleet.fleet_round !== null ? fleet.fleet_round - 1 : "–", false, "highest round finished"],
    ["bytes sent", fmtBytes(c.bytes_sent), false, ""],
    ["reroutes", c.reroutes, c.reroutes > 0, ""],
    ["timeouts", c.timeouts, c.timeouts > 0, ""],
    ["degraded rounds", c.degraded_rounds, c.degraded_rounds > 0, ""],
    ["rejected frames", c.rejected_total, c.rejected_total > 0,
      rejected.map(([r, n]) => `${r} ${n}`).join(", ")],
    ["refused requests", c.refused_requests_total, c.refused_requests_total > 0,
      Object.entries(c.refused_requests).map(([r, n]) => `${r} ${n}`).join(", ")],
    // A report that came twice (a resend under load) is ignored without alarm.
    ["ignored messages", c.malformed_total, c.malformed_total - (c.malformed.telemetry_repeat || 0) > 0,
      Object.entries(c.malformed).map(([r, n]) => `${r} ${n}`).join(", ")],
    trainingCounter(),
  ];
  const box = document.getElementById("counters");
  box.replaceChildren(...items.map(([label, value, alert, detail]) => {
    const div = html("div", "counter");
    div.dataset.alert = alert ? "true" : "false";
    div.dataset.counter = label;
    div.append(html("div", "label", label), html("div", "value", String(value)));
    if (detail) { div.append(html("div", "detail", detail)); div.title = detail; }
    return div;
  }));
}

// Local steps per sync, sync against compute time and bytes per sample, from the newest round
// whose agents said their samples (periodic averaging's cost and what it buys).
function trainingCounter() {
  let latest = null;
  for (const r of model.rounds.values()) if (r.samples > 0 && (latest === null || r.round > latest.round)) latest = r;
  if (latest === null) return ["local steps / sync", "–", false, "no round with its samples yet"];
  const busy = latest.sync_seconds + latest.compute_seconds;
  const share = busy > 0 ? `${Math.round((100 * latest.sync_seconds) / busy)} % of the round` : "";
  const perSample = latest.bytes_per_sample === null ? "–" : fmtBytes(latest.bytes_per_sample);
  return ["local steps / sync", latest.local_steps, false,
    `r${latest.round}: sync ${latest.sync_seconds.toFixed(2)} s vs compute ${latest.compute_seconds.toFixed(2)} s` +
    (share ? ` (${share})` : "") + ` · ${perSample} sent per sample trained`];
}

function renderLegend() {
  const legend = document.getElementById("legend");
  const item = (swatch, text) => `<span class="item">${swatch}${text}</span>`;
  const parts = ["online", "joining", "rejoining", "suspected", "hung", "evicted", "offline"].map((s) =>
    item(`<span class="dot" style="background:${COLORS[s]}"></span>`, s));
  parts.push(item(`<span class="dot ring"></span>`, "at fault"));
  parts.push(`<span class="sep"></span>`);
  for (const s of ["ok", "suspected", "failed"]) {
    parts.push(item(`<span class="bar" style="background:${COLORS[s]}"></span>`, `link ${s}`));
  }
  parts.push(item(`<span class="bar dashed"></span>`, "backup"));
  parts.push(item(`<span class="bar" style="background:${COLORS.rerouted}"></span>`, "backup route in use"));
  legend.innerHTML = parts.join("");
  const markers = document.getElementById("marker-legend");
  const windows = [INCIDENT.LINK, INCIDENT.CRASH, INCIDENT.HANG, INCIDENT.LOSS, INCIDENT.LATENCY].map((k) =>
    item(`<span class="band" style="background:${FAULT_COLORS[k]}"></span>`, `${k} window`));
  const marks = [[INCIDENT.CRASH, "crash"], [NOTE.REJOIN, "rejoin"], [INCIDENT.HANG, "hung"],
    [EVENT.VIEW_CHANGE, "view change"]]
    .map(([k, name]) => item(`<span class="mark" style="background:${MARK_COLORS[k]}"></span>`, name));
  marks.push(item(`<span class="mark operator"></span>`, "operator's command"),
    item(`<span class="mark at-round"></span>`, "replay round"));
  markers.innerHTML = `<span>charts:</span>${windows.join("")}${marks.join("")}`;
}

// ------------------------------------------------------------------ tree

function homeIds(fleet) {
  // Every node the run knows keeps one place, whatever happens to it: a crashed, hung or
  // evicted node is drawn greyed where it was, not moved to a corner.
  const ids = new Set(fleet.nodes.map((n) => n.node));
  if (fleet.run.fleet_size) for (let i = 0; i < fleet.run.fleet_size; i += 1) ids.add(i);
  if (fleet.view) for (const m of fleet.view.members) ids.add(m);
  return [...ids].sort((a, b) => a - b);
}

function treeLayout(ids, arity, width, height) {
  // Heap-order k-ary tree over the home ids: level d holds k^d slots, spread evenly.
  const pos = new Map();
  let levels = 0;
  for (let count = 0, w = 1; count < ids.length; count += w, w *= arity) levels += 1;
  const gap = levels > 1 ? (height - 70) / (levels - 1) : 0;
  let start = 0;
  for (let d = 0, slots = 1; start < ids.length; d += 1, slots *= arity) {
    for (let i = 0; i < slots && start + i < ids.length; i += 1) {
      pos.set(ids[start + i], { x: ((i + 0.5) / slots) * width, y: 30 + d * gap });
    }
    start += slots;
  }
  return pos;
}

// ------------------------------------------------------------------ sites

// The nodes of each site, in the tree's order: the root's site first (its root first), then
// the sites by their lowest node, as the agents build a site-aware tree. Each group spans a
// column of the tree card, as wide as its share of the nodes.
function siteGroups(fleet, order) {
  const siteOf = new Map(fleet.nodes.map((n) => [n.node, n.site]));
  const groups = new Map();
  for (const id of order) {
    const site = siteOf.get(id) || "";
    if (!groups.has(site)) groups.set(site, []);
    groups.get(site).push(id);
  }
  for (const s of fleet.sites) if (!groups.has(s.name)) groups.set(s.name, []); // a bridge, no node yet
  let x = 0;
  const total = Math.max(1, [...groups.values()].reduce((sum, g) => sum + Math.max(1, g.length), 0));
  return [...groups.entries()].map(([site, ids], i) => {
    const share = Math.max(1, ids.length) / total;
    const group = { site, ids, index: i, x0: x, share };
    x += share;
    return group;
  });
}

function heapDepth(index, arity) {
  // The level of slot ``index`` in a heap-order k-ary tree (0: the root).
  let depth = 0;
  for (let first = 0, width = 1; index >= first + width; first += width, width *= arity) depth += 1;
  return depth;
}

function siteLayout(groups, arity, width, height) {
  // Site roots form a k-ary tree of their own: a site's column starts at its root's level;
  // inside, the site's nodes follow in heap order below their site root.
  const inner = (n) => heapDepth(Math.max(0, n - 1), arity) + 1;
  const levels = Math.max(...groups.map((g) => heapDepth(g.index, arity) + inner(g.ids.length)));
  const top = 48;  // below the site labels; the bottom row keeps room for its round label
  const gap = levels > 1 ? (height - top - 44) / (levels - 1) : 0;
  const pos = new Map();
  for (const g of groups) {
    const x0 = g.x0 * width;
    const w = g.share * width;
    const start = heapDepth(g.index, arity);
    let placed = 0;
    for (let d = 0, slots = 1; placed < g.ids.length; d += 1, slots *= arity) {
      for (let i = 0; i < slots && placed + i < g.ids.length; i += 1) {
        pos.set(g.ids[placed + i], { x: x0 + ((i + 0.5) / slots) * w, y: top + (start + d) * gap });
      }
      placed += slots;
    }
  }
  return pos;
}

function bridgeText(bridge) {
  if (!bridge || bridge.state === "unknown") return "bridge ?";
  const since = bridge.since === null ? "" : ` ${fmtAgo(bridge.since)}`;
  return `bridge ${bridge.state}${since}`;
}

function fmtAgo(unix) {
  const s = Math.max(0, Date.now() / 1000 - unix);
  return s < 90 ? `${s.toFixed(0)} s` : s < 5400 ? `${(s / 60).toFixed(0)} min` : `${(s / 3600).toFixed(1)} h`;
}

function drawSiteBoxes(svg, groups, fleet, height) {
  const width = Number(svg.getAttribute("viewBox").split(" ")[2]);
  const sites = new Map(fleet.sites.map((s) => [s.name, s]));
  const layer = el("g", { class: "sites" }, svg);
  for (const g of groups) {
    const bridge = sites.has(g.site) ? sites.get(g.site).bridge : null;
    const state = bridge ? bridge.state : "unknown";
    const box = el("g", { class: "site", "data-site": g.site, "data-bridge": state }, layer);
    el("rect", { x: g.x0 * width + 3, y: 3, width: Math.max(0, g.share * width - 6), height: height - 6,
      rx: 10, class: "site-box" }, box);
    const label = el("text", { x: g.x0 * width + 12, y: 20, class: "site-label" }, box);
    label.textContent = g.site ? `site ${g.site}` : "no site";
    if (g.site) {
      const badge = el("tspan", { dx: 8, class: "bridge", "data-state": state }, label);
      badge.textContent = bridgeText(bridge);
    }
    el("title", {}, box).textContent = g.site
      ? `site ${g.site}: ${g.ids.length} nodes; ${bridgeTitle(bridge)}` : "nodes without a site";
  }
}

function bridgeTitle(bridge) {
  if (!bridge) return "no bridge reported";
  const since = bridge.since === null ? "" : ` since ${new Date(bridge.since * 1000).toLocaleTimeString([], { hour12: false })}`;
  const said = bridge.source ? ` (${bridge.source === "broker" ? "the broker says" : "the simulator's uplink"})` : "";
  return `bridge ${bridge.state}${since}${said}, ${bridge.downs} time${bridge.downs === 1 ? "" : "s"} down; ${bytesText(bridge)}`;
}

function fmtRate(r) { return r === null || r === undefined ? "–" : `${fmtBytes(r)}/s`; }

function bytesText(bridge) {
  if (bridge.bytes_up === null) return "bytes not counted";
  return `↑ ${fmtBytes(bridge.bytes_up)} (${fmtRate(bridge.rate_up)}) · ↓ ${fmtBytes(bridge.bytes_down)} (${fmtRate(bridge.rate_down)})`;
}

function renderSites(fleet) {
  // One row per site: its nodes, its bridge's state and since when, the bytes each way.
  const card = document.getElementById("sites-card");
  card.hidden = !fleet.sites.length;
  if (card.hidden) return;
  document.getElementById("site-count").textContent = `${fleet.sites.length} sites · `
    + `${fleet.sites.filter((s) => s.bridge && s.bridge.state === "down").length} bridges down`;
  const body = document.querySelector("#sites tbody");
  body.replaceChildren(...fleet.sites.map((s) => {
    const b = s.bridge;
    const tr = html("tr");
    Object.assign(tr.dataset, { site: s.name, bridge: b ? b.state : "unknown", source: b ? b.source : "",
      bytesUp: b && b.bytes_up !== null ? b.bytes_up : "", bytesDown: b && b.bytes_down !== null ? b.bytes_down : "" });
    const badge = html("span", "badge", b ? b.state : "unknown");
    badge.style.background = BRIDGE_COLORS[b ? b.state : "unknown"];
    const state = html("td");
    state.append(badge);
    const since = b && b.since !== null
      ? `${new Date(b.since * 1000).toLocaleTimeString([], { hour12: false })} (${fmtAgo(b.since)} ago)` : "–";
    const cells = [html("td", "", s.name), html("td", "", s.nodes.join(", ") || "–"), state,
      html("td", "", since), html("td", "wide", b ? String(b.downs) : "–"),
      html("td", "", b && b.bytes_up !== null ? fmtBytes(b.bytes_up) : "–"),
      html("td", "", b && b.bytes_down !== null ? fmtBytes(b.bytes_down) : "–"),
      html("td", "", b ? fmtRate(b.rate_up) : "–"), html("td", "", b ? fmtRate(b.rate_down) : "–")];
    if (b) cells[2].title = bridgeTitle(b);
    tr.append(...cells);
    return tr;
  }));
}

function linkShape(link, a, b, layer) {
  const bad = !["ok", "unknown"].includes(link.state);
  const inUse = link.kind === "backup" && link.state === "rerouted";
  const attrs = {
    class: "link", "data-a": link.a, "data-b": link.b, "data-state": link.state,
    "data-kind": link.kind, "data-blame": link.blame, stroke: COLORS[link.state] || COLORS.unknown,
  };
  // A link whose trouble comes from a node at fault is drawn faint: the node carries the blame.
  if (link.blame === "node") attrs.opacity = 0.4;
  if (link.kind === "tree") {
    return el("line", { ...attrs, x1: a.x, y1: a.y, x2: b.x, y2: b.y, "stroke-width": bad ? 4 : 2.5 }, layer);
  }
  // Backup and extra links bow away from the straight line so they never run through a node.
  const mx = (a.x + b.x) / 2;
  const my = Math.min(a.y, b.y) - 28 - Math.abs(a.x - b.x) * 0.12;
  return el("path", {
    ...attrs, d: `M ${a.x} ${a.y} Q ${mx} ${my} ${b.x} ${b.y}`,
    "stroke-width": inUse ? 3.5 : bad ? 3 : 1.4, "stroke-dasharray": inUse ? "" : "5 4",
    stroke: bad ? COLORS[link.state] : "#b5bdc9",
  }, layer);
}

function renderTree(fleet) {
  const svg = document.getElementById("tree");
  const width = svg.clientWidth || 700;
  const height = svg.clientHeight || 340;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  clear(svg);
  const ids = homeIds(fleet);
  // The agents' tree is rooted at the view's coordinator (the lowest established member), not
  // always the lowest id: it takes the top place, the others keep theirs in id order.
  const view = fleet.view;
  const root = view && view.members.length
    ? (view.members.includes(view.coordinator) ? view.coordinator : view.members[0]) : null;
  const order = root === null ? ids : [root, ...ids.filter((id) => id !== root)];
  const arity = view ? view.arity : 2;
  const groups = fleet.sites.length ? siteGroups(fleet, order) : null;
  const pos = groups ? siteLayout(groups, arity, width, height) : treeLayout(order, arity, width, height);
  if (groups) drawSiteBoxes(svg, groups, fleet, height);
  const radius = Math.max(10, Math.min(18, (width / Math.max(1, ids.length)) * 0.3));
  const linkLayer = el("g", { class: "links" }, svg);
  for (const link of fleet.links) {
    const a = pos.get(link.a);
    const b = pos.get(link.b);
    if (!a || !b) continue;
    const shape = linkShape(link, a, b, linkLayer);
    el("title", {}, shape).textContent = `${link.kind} link ${link.a}–${link.b}: ${link.state}`
      + (link.blame === "node" ? " (a node at its end is at fault)" : "");
  }
  const nodes = new Map(fleet.nodes.map((n) => [n.node, n]));
  const nodeLayer = el("g", { class: "nodes" }, svg);
  for (const id of ids) {
    drawNode(nodeLayer, id, nodes.get(id), pos.get(id), radius, fleet);
  }
}

function drawNode(layer, id, node, p, radius, fleet) {
  const state = node ? node.state : "unknown";
  const inView = node ? node.in_view : Boolean(fleet.view && fleet.view.members.includes(id));
  const g = el("g", {
    class: "node", "data-node": id, "data-state": state, "data-in-view": inView,
    "data-at-fault": node ? node.at_fault : false, transform: `translate(${p.x},${p.y})`,
  }, layer);
  const down = ["offline", "hung", "unknown"].includes(state) || !inView;
  if (node && node.at_fault) el("circle", { class: "fault-ring", r: radius + 5 }, g);
  el("circle", {
    class: "body", r: radius, fill: COLORS[state] || COLORS.unknown, opacity: down ? 0.55 : 1,
    "stroke-dasharray": inView ? "" : "3 2",
  }, g);
  el("text", {}, g).textContent = id;
  const sub = node && node.exited ? "done" : !inView && fleet.view ? "not in view" : state === "offline" ? "offline"
    : state === "hung" ? "hung" : node && node.last_round !== null && radius >= 14 ? `r${node.last_round}` : "";
  el("text", { class: `sub ${down ? "down" : ""}`, y: radius + 12 }, g).textContent = sub;
  el("title", {}, g).textContent = `node ${id}: ${state}${inView ? "" : ", not in the current view"}`
    + (node && node.last_round !== null ? `, round ${node.last_round}` : "")
    + (node && node.seconds_silent !== null ? `, silent ${node.seconds_silent.toFixed(1)} s` : "")
    + (node && node.faults.length ? `, active fault: ${node.faults.join(", ")}` : "");
}

// ------------------------------------------------------------------ timeline

function groupEvents(events) {
  // Chatty per-chunk rows (pull, relay, nack, ...) of nearby rounds collapse into one row with
  // a count; a repeated identical event likewise.
  const groups = [];
  for (const e of events) {
    const key = CHATTY.has(e.kind) ? e.kind : `${e.kind}|${e.node}|${e.peer}|${e.detail}`;
    const last = groups.length ? groups[groups.length - 1] : null;
    const near = last && e.round !== null && last.last.round !== null && e.round - last.last.round <= 2;
    if (last && last.key === key && near) {
      last.count += 1;
      last.last = e;
      last.nodes.add(e.node);
    } else {
      groups.push({ key, first: e, last: e, count: 1, nodes: new Set([e.node]) });
    }
  }
  return groups;
}

function filteredEvents() {
  const kinds = FILTERS[ui.filter];
  return kinds ? model.events.filter((e) => kinds.has(e.kind)) : model.events;
}

function eventRow(g) {
  const e = g.last;
  const li = html("li");
  Object.assign(li.dataset, { kind: e.kind, round: e.round ?? "", node: e.node ?? "", count: g.count, by: e.by || "" });
  const when = new Date(e.time * 1000).toLocaleTimeString([], { hour12: false });
  const rounds = g.count > 1 && g.first.round !== e.round ? `r${g.first.round}–${e.round}` : `r${e.round}`;
  const chatty = CHATTY.has(e.kind) && g.count > 1;
  const who = chatty ? `${g.nodes.size} node${g.nodes.size > 1 ? "s" : ""}`
    : [e.node !== null ? `node ${e.node}` : "", e.peer !== null ? `→ ${e.peer}` : ""].filter(Boolean).join(" ");
  const head = [e.round !== null ? rounds : "", who].filter(Boolean).join(" ");
  const detail = chatty ? `×${g.count}` : `${e.detail}${g.count > 1 ? ` (×${g.count})` : ""}`;
  const badge = html("span", "badge", e.kind.replace(/_/g, " "));
  badge.style.background = COLORS[EVENT_BADGE[e.kind]] || COLORS.unknown;
  const badgeCell = html("span");
  badgeCell.append(badge);
  li.append(html("span", "when", when), badgeCell,
    html("span", "what", `${head}${head && detail ? " · " : ""}${detail}`));
  return li;
}

function replayRounds() {
  const rounds = [...model.rounds.keys()];
  return rounds.length ? [Math.min(...rounds), Math.max(...rounds)] : [0, 0];
}

function renderReplayBar(fleet) {
  const bar = document.getElementById("replay-bar");
  bar.hidden = !fleet.run.replay_of;
  if (bar.hidden) return;
  const slider = document.getElementById("replay-round");
  const [first, last] = replayRounds();
  slider.min = String(first);
  slider.max = String(last);
  if (ui.atRound === null) slider.value = String(last);
  document.getElementById("replay-round-value").textContent = ui.atRound === null
    ? `round ${last} (end of the run)` : `round ${ui.atRound}`;
  bar.dataset.round = ui.atRound === null ? "end" : String(ui.atRound);
  // Loaded: the fleet shown is the one at the slider's round (none is being fetched).
  bar.dataset.loaded = ui.atRound === null || (!ui.atLoading && model.atFleet !== null) ? "true" : "false";
}

async function showRound(round) {
  // The charts follow the slider at once; the fleet at that round comes from the server. One
  // request at a time: a drag's rounds that went by meanwhile are skipped, the latest is asked.
  const [, last] = replayRounds();
  ui.atAsked += 1;
  if (round >= last) { ui.atRound = null; model.atFleet = null; scheduleRender(); return; }
  ui.atRound = round;
  document.getElementById("replay-bar").dataset.loaded = "false";
  scheduleRender();
  if (ui.atLoading) return;
  ui.atLoading = true;
  try {
    while (ui.atRound !== null) {
      const [want, asked] = [ui.atRound, ui.atAsked];
      const reply = await fetch(`/api/fleet?round=${want}`);
      const fleet = reply.ok ? await reply.json() : null;
      if (asked !== ui.atAsked) continue; // the slider moved on: ask for where it is now
      if (fleet) model.atFleet = fleet;
      break;
    }
  } finally {
    ui.atLoading = false;
    scheduleRender();
  }
}

function stepRound(delta) {
  const slider = document.getElementById("replay-round");
  const value = Math.min(Number(slider.max), Math.max(Number(slider.min), Number(slider.value) + delta));
  slider.value = String(value);
  showRound(value);
}

async function loadEarlierEvents() {
  const first = model.events.length ? model.events[0].seq : null;
  if (first === null || first <= 1) return;
  const reply = await fetch(`/api/events?before=${first}&limit=${EARLIER_PAGE}`);
  if (!reply.ok) return;
  const older = await reply.json();
  model.events = older.concat(model.events.filter((e) => e.seq >= first));
  scheduleRender();
}

function firstRoundLoaded() {
  let first = null;
  for (const r of model.rounds.keys()) if (first === null || r < first) first = r;
  return first;
}

async function loadEarlierRounds(all = false) {
  // The server keeps every round; the socket pushes only the latest. Page back from the
  // first round the page holds, one page per click (every page when `all`).
  if (ui.loadingRounds) return;
  ui.loadingRounds = true;
  try {
    for (;;) {
      const first = firstRoundLoaded();
      const serverFirst = model.fleet ? model.fleet.counters.first_round : null;
      if (first === null || serverFirst === null || first <= serverFirst) break;
      const reply = await fetch(`/api/rounds?before=${first}&limit=${EARLIER_ROUNDS_PAGE}`);
      if (!reply.ok) break;
      const older = await reply.json();
      if (!older.length) break;
      for (const r of older) if (!model.rounds.has(r.round)) model.rounds.set(r.round, r);
      scheduleRender();
      if (!all) break;
    }
  } finally {
    ui.loadingRounds = false;
    scheduleRender();
  }
}

function renderRoundsNote() {
  // Say when the charts do not start at the run's first round, and how many rounds are not loaded.
  const note = document.getElementById("rounds-note");
  const first = firstRoundLoaded();
  const serverFirst = model.fleet ? model.fleet.counters.first_round : null;
  const missing = first !== null && serverFirst !== null && first > serverFirst;
  note.hidden = !missing;
  if (!missing) return;
  document.getElementById("rounds-note-text").textContent = ui.loadingRounds
    ? `loading rounds ${serverFirst}–${first - 1}…`
    : `The charts show rounds ${first}–${model.fleet.counters.latest_round}; the server holds `
      + `every round of the run from round ${serverFirst}.`;
  const button = document.getElementById("rounds-earlier");
  button.disabled = ui.loadingRounds;
  button.textContent = `load earlier rounds (${first - serverFirst} more)`;
}

function renderEvents() {
  const list = document.getElementById("events");
  const shown = ui.atRound === null ? filteredEvents()
    : filteredEvents().filter((e) => e.round === null || e.round <= ui.atRound);
  const groups = groupEvents(shown).slice(-MAX_ROWS_SHOWN).reverse();
  const first = model.events.length ? model.events[0].seq : 1;
  const total = model.fleet ? model.fleet.counters.events : 0;
  // Events the server no longer holds (past its --max-history) are said, not hidden.
  const dropped = model.fleet ? model.fleet.counters.events_dropped : 0;
  const gone = dropped ? ` (the first ${dropped} no longer kept by the server)` : "";
  document.getElementById("event-count").textContent = model.fleet
    ? (first > 1 ? `${model.events.length} of ${total} events loaded${gone}` : `${total} events`) : "";
  const earlier = document.getElementById("events-earlier");
  earlier.hidden = first <= dropped + 1;
  earlier.textContent = `load earlier events (${first - 1 - dropped} more)`;
  list.replaceChildren(...(groups.length ? groups.map(eventRow)
    : [html("li", "none", "Nothing of this kind yet.")]));
}

// ------------------------------------------------------------------ charts: in charts.js

// ------------------------------------------------------------------ nodes

function renderNodes(fleet) {
  const body = document.querySelector("#nodes tbody");
  if (!fleet.sites.length) { body.replaceChildren(...fleet.nodes.map(nodeRow)); return; }
  // A fleet over sites: each site's nodes under a row that names the site and its bridge.
  const rows = [];
  const named = new Set(fleet.sites.map((s) => s.name));
  const groups = [...fleet.sites.map((s) => [s.name, s.bridge]), ["", null]];
  for (const [site, bridge] of groups) {
    const nodes = fleet.nodes.filter((n) => (named.has(n.site) ? n.site : "") === site);
    if (!nodes.length && !site) continue;
    const head = html("tr", "site-row");
    Object.assign(head.dataset, { site, bridge: bridge ? bridge.state : "unknown" });
    const td = html("td", "", site ? `site ${site} · ${nodes.length} nodes · ${bridgeText(bridge)}` : "no site");
    td.colSpan = 12;
    if (site) td.title = bridgeTitle(bridge);
    head.append(td);
    rows.push(head, ...nodes.map(nodeRow));
  }
  body.replaceChildren(...rows);
}

function nodeRow(n) {
  const tr = html("tr");
  tr.dataset.node = n.node;
  tr.dataset.site = n.site;
  const rejected = Object.entries(n.rejected).filter(([, v]) => v > 0);
  const cells = [
    [n.node, ""], [null, ""], [n.last_round ?? "–", ""],
    [n.seconds_silent === null ? "–" : `${n.seconds_silent.toFixed(1)} s`, "wide"],
    [fmtNum(n.loss), ""], [fmtPct(n.accuracy), ""], [fmtBytes(n.bytes_sent), "wide"],
    [n.reroutes, "wide"], [n.restarts, ""],
    [rejected.length ? rejected.map(([r, v]) => `${r} ${v}`).join(", ") : "0", "wide"],
    [n.model_hash ? n.model_hash.slice(0, 10) : "–", "wide mono"],
    [null, "labels"],
  ];
  cells.forEach(([value, cls], i) => {
    const td = html("td", cls);
    if (i === cells.length - 1) {
      td.append(labelBar(n.labels));
    } else if (i === 1 && n.model_mismatch) {
      const badge = html("span", "badge", "other model");
      badge.style.background = COLORS.evicted;
      badge.title = `runs ${n.model || "?"} (${n.fingerprint || "no fingerprint"}), not the fleet's model: refused`;
      td.append(badge);
    } else if (i === 1) {
      const badge = html("span", "badge", n.at_fault ? `${n.state} · at fault` : n.state);
      badge.style.background = COLORS[n.state] || COLORS.unknown;
      td.append(badge);
    } else if (i === 0) {
      td.textContent = value;
      const open = html("button", "log-open", "log");
      open.type = "button";
      open.dataset.logNode = String(n.node);
      open.title = `show the tail of node ${n.node}'s agent log`;
      td.append(" ", open);
    } else {
      td.textContent = value;
    }
    tr.append(td);
  });
  return tr;
}

// ------------------------------------------------------------------ agent logs

function renderLogPicker(fleet) {
  // One option per node the fleet knows; the chosen one stays chosen across redraws.
  const select = document.getElementById("log-node");
  const ids = fleet.nodes.map((n) => String(n.node));
  const have = [...select.options].map((o) => o.value);
  if (ids.join(",") === have.join(",")) return;
  const chosen = select.value;
  select.replaceChildren(...ids.map((id) => { const o = html("option", "", id); o.value = id; return o; }));
  if (ids.includes(chosen)) select.value = chosen;
}

async function showLog(node) {
  const meta = document.getElementById("log-meta");
  const pre = document.getElementById("log-tail");
  const select = document.getElementById("log-node");
  if (node !== undefined) select.value = String(node);
  const id = select.value;
  if (id === "") return;
  meta.textContent = `loading node ${id}'s log…`;
  pre.dataset.node = id;
  try {
    const reply = await fetch(`/api/nodes/${encodeURIComponent(id)}/log?lines=${LOG_LINES}`);
    const data = await reply.json();
    if (pre.dataset.node !== id) return; // another node was asked for meanwhile
    if (!reply.ok) {
      pre.hidden = true;
      meta.dataset.state = "missing";
      meta.textContent = typeof data.detail === "string" ? data.detail : `no log for node ${id}`;
      return;
    }
    meta.dataset.state = "shown";
    meta.textContent = `${data.path} · ${fmtBytes(data.size)} · `
      + (data.truncated ? `last ${data.lines.length} lines` : `all ${data.lines.length} lines`);
    pre.textContent = data.lines.join("\n");
    pre.hidden = false;
    pre.scrollTop = pre.scrollHeight;
  } catch (err) {
    meta.dataset.state = "missing";
    meta.textContent = `could not load the log: ${err}`;
  }
}

// A node's shard: one stacked bar, a segment per label, its counts on hover.
function labelBar(labels) {
  const total = labels.reduce((a, b) => a + b, 0);
  if (!total) return html("span", "", "–");
  const bar = html("div", "label-bar");
  bar.dataset.testid = "label-bar";
  labels.forEach((count, label) => {
    if (!count) return;
    const seg = html("span", "label-seg");
    seg.style.width = `${(100 * count) / total}%`;
    seg.style.background = LABEL_COLORS[label % LABEL_COLORS.length];
    seg.title = `label ${label}: ${count}`;
    bar.append(seg);
  });
  bar.title = `${total} samples: ` + labels.map((c, l) => `${l}: ${c}`).join(", ");
  return bar;
}

// ------------------------------------------------------------------ controls

function fleetIds(fleet) {
  if (fleet.run.fleet_size) return [...Array(fleet.run.fleet_size).keys()];
  return homeIds(fleet);
}

function renderControls(fleet) {
  const card = document.getElementById("controls");
  const enabled = fleet.controls_enabled && !fleet.run.replay_of;
  card.hidden = !enabled;
  // A finished run takes no commands: the form stays readable, every field disabled.
  const over = fleet.run.phase !== "live";
  card.dataset.finished = over ? "true" : "false";
  card.parentElement.classList.toggle("single", !enabled);
  const ids = fleetIds(fleet);
  if (ids.length) {
    for (const id of ["control-node", "control-peer"]) {
      document.getElementById(id).max = String(ids[ids.length - 1]);
    }
  }
  updateControlForm();
  showOutcome();
}

function controlProblem() {
  // The same checks as the server's, so the operator sees them before sending.
  const value = (id) => document.getElementById(id).value;
  const action = value("control-action");
  const ids = model.fleet ? fleetIds(model.fleet) : [];
  const inFleet = (v) => !ids.length || ids.includes(Number(v));
  const me = ui.me || {};
  if (me.name && me.role !== "operator") return `${me.name} is a ${me.role}: a viewer only reads`;
  if (!value("control-token") && !sessionOperator()) return "enter the control token to send";
  if (!NO_NODE.has(action) && (value("control-node") === "" || !inFleet(value("control-node")))) {
    return `node must be one of the fleet's (${ids.length ? `${ids[0]}–${ids[ids.length - 1]}` : "none known"})`;
  }
  if (NEEDS_PEER.has(action) && value("control-peer") === "") return `${action} needs a peer`;
  if (value("control-peer") !== "" && !inFleet(value("control-peer"))) return "peer is not in the fleet";
  if (value("control-peer") !== "" && value("control-peer") === value("control-node")) return "a link needs two different nodes";
  if (NEEDS_VALUE.has(action) && value("control-value") === "") return `${action} needs a value`;
  return "";
}

function updateControlForm() {
  const action = document.getElementById("control-action").value;
  document.getElementById("control-peer").disabled = !NEEDS_PEER.has(action);
  document.getElementById("control-one-way").disabled = !NEEDS_PEER.has(action);
  document.getElementById("control-value").disabled = !NEEDS_VALUE.has(action);
  const problem = controlProblem();
  // Send stays disabled without a token; other problems are explained and checked by the server.
  const over = Boolean(model.fleet) && model.fleet.run.phase !== "live";
  for (const id of ["control-token", "control-action", "control-node"]) document.getElementById(id).disabled = over;
  document.getElementById("control-node").disabled = over || NO_NODE.has(action);
  if (over) for (const id of ["control-peer", "control-one-way", "control-value"]) document.getElementById(id).disabled = true;
  const viewer = Boolean(ui.me && ui.me.name && ui.me.role !== "operator");
  document.getElementById("control-token").closest("label").hidden = Boolean(ui.me && ui.me.via === "session");
  document.getElementById("control-send").disabled = over || viewer
    || (!document.getElementById("control-token").value && !sessionOperator());
  document.getElementById("control-hint").textContent = problem;
}

// Logged in with an operator account: the session cookie carries the command, no token.
function sessionOperator() { return Boolean(ui.me && ui.me.via === "session" && ui.me.role === "operator"); }

function controlBody() {
  const value = (id) => document.getElementById(id).value;
  const action = value("control-action");
  const body = { action, node: NO_NODE.has(action) ? 0 : Number(value("control-node")) };
  if (NEEDS_PEER.has(action) && value("control-peer") !== "") body.peer = Number(value("control-peer"));
  if (NEEDS_VALUE.has(action) && value("control-value") !== "") body.value = Number(value("control-value"));
  if (NEEDS_PEER.has(action)) body.one_way = document.getElementById("control-one-way").checked;
  return body;
}

function setResult(state, text) {
  const result = document.getElementById("control-result");
  result.dataset.state = state;
  result.textContent = text;
}

async function sendControl(event) {
  event.preventDefault();
  const token = document.getElementById("control-token").value;
  sessionStorage.setItem("edgegrove-token", token);
  const body = controlBody();
  const what = NO_NODE.has(body.action) ? `${body.action} for ${body.value} s`
    : `${body.action} node ${body.node}${body.peer !== undefined ? `→${body.peer}` : ""}`;
  setResult("sending", `sending ${what}…`);  // the previous command's outcome is not this one's
  if (CONFIRM_ACTIONS.has(body.action) && !window.confirm(`Really ${what}?`)) {
    setResult("cancelled", `not sent: ${what}`);
    return;
  }
  try {
    const response = await fetch("/api/control", {
      method: "POST",
      headers: token ? { "Content-Type": "application/json", Authorization: `Bearer ${token}` }
        : { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await response.json();
    if (!response.ok) {
      ui.pending = null;
      setResult("refused", `refused by the dashboard: ${typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail)}`);
      return;
    }
    ui.pending = { body, after: data.after, sentAt: Date.now(), what };
    setResult("sent", `sent ${what}; waiting for the simulator's outcome…`);
    setTimeout(showOutcome, OUTCOME_WAIT_MS + 50);
  } catch (err) {
    setResult("failed", `failed: ${err}`);
  }
}

function showOutcome() {
  const pending = ui.pending;
  if (!pending || !model.fleet) return;
  const outcome = model.fleet.controls.find((c) => c.seq > pending.after
    && c.action === pending.body.action && c.node === pending.body.node);
  if (outcome) {
    setResult(outcome.applied ? "applied" : "ignored",
      `${outcome.applied ? "applied" : "ignored by the simulator"}: ${pending.what} · ${outcome.outcome}`);
    ui.pending = null;
  } else if (Date.now() - pending.sentAt > OUTCOME_WAIT_MS) {
    setResult("unanswered", `sent ${pending.what}; no simulator reported an outcome (the agents apply link, loss and latency commands themselves)`);
    ui.pending = null;
  }
}

// ------------------------------------------------------------------ wiring

function setFilter(name) {
  ui.filter = name;
  for (const b of document.querySelectorAll("#event-filters button")) {
    b.setAttribute("aria-pressed", b.dataset.filter === name ? "true" : "false");
  }
  renderEvents();
}

window.addEventListener("resize", () => scheduleRender());
document.getElementById("control-form").addEventListener("submit", sendControl);
document.getElementById("control-form").addEventListener("input", updateControlForm);
document.getElementById("control-token").value = sessionStorage.getItem("edgegrove-token") || "";
document.getElementById("event-filters").addEventListener("click", (e) => {
  if (e.target.dataset && e.target.dataset.filter) setFilter(e.target.dataset.filter);
});
document.getElementById("events-earlier").addEventListener("click", loadEarlierEvents);
document.getElementById("log-show").addEventListener("click", () => showLog());
document.getElementById("nodes").addEventListener("click", (e) => {
  const node = e.target.dataset ? e.target.dataset.logNode : undefined;
  if (node !== undefined) { showLog(node); document.getElementById("log-card").scrollIntoView({ block: "nearest" }); }
});
document.getElementById("rounds-earlier").addEventListener("click", () => loadEarlierRounds(false));
document.getElementById("replay-round").addEventListener("input", (e) => showRound(Number(e.target.value)));
document.getElementById("replay-end").addEventListener("click", () => { ui.atAsked += 1; ui.atRound = null; model.atFleet = null; scheduleRender(); });
document.addEventListener("keydown", (e) => {
  // Keyboard steps through a replay: [ and ] (or arrows on the slider itself) by one round.
  if (document.getElementById("replay-bar").hidden || e.target.matches("input:not([type=range]), select, textarea")) return;
  // The focused slider steps itself on arrows, Home/End and Page keys (its input event shows
  // the round); [ and ] step it too.
  const onSlider = e.target.id === "replay-round";
  if (e.key === "[" || (e.key === "ArrowLeft" && !onSlider)) { stepRound(-1); e.preventDefault(); }
  if (e.key === "]" || (e.key === "ArrowRight" && !onSlider)) { stepRound(1); e.preventDefault(); }
});
document.getElementById("time-agent").addEventListener("change", (e) => {
  ui.timeAgent = e.target.value;
  scheduleRender();
});
document.getElementById("zoom-reset").addEventListener("click", resetZoom);
document.getElementById("export-csv").addEventListener("click", exportCsv);
document.getElementById("node-pick").addEventListener("click", (e) => {
  const button = e.target.closest("button[data-series-node]");
  if (button) toggleNode(Number(button.dataset.seriesNode));
});
document.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-png]");
  if (button) exportPng(button.dataset.png);
});
renderLegend();
updateControlForm();
connect();
