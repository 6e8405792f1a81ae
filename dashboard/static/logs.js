// The device logs view (#logs): the devices' warnings and errors from /api/logs, newest first,
// searched and filtered by level and device on the server, each at the round its device was in.
// "follow live" asks for new lines every second. Loaded after views.js; uses app.js's html.
"use strict";

const LOGS_POLL_MS = 1000;
const LOGS_KEPT = 2000;
const logsUi = { lines: [], lastSeq: 0, asked: 0, timer: null, devices: [] };

function logsQuery(since) {
  const params = new URLSearchParams({ level: document.getElementById("logs-level").value });
  const device = document.getElementById("logs-device").value;
  const q = document.getElementById("logs-q").value.trim();
  if (device) params.set("device", device);
  if (q) params.set("q", q);
  if (since) params.set("since", String(since));
  return `/api/logs?${params}`;
}

function logsShown() { return document.getElementById("main").dataset.view === "logs"; }

async function refreshLogs(reset) {
  clearTimeout(logsUi.timer);
  if (!logsShown()) return;
  if (reset) { logsUi.lines = []; logsUi.lastSeq = 0; }
  const asked = ++logsUi.asked;
  try {
    const reply = await fetch(logsQuery(logsUi.lastSeq));
    if (reply.ok && asked === logsUi.asked) {
      const page = await reply.json();
      logsUi.lines = logsUi.lines.concat(page.lines).slice(-LOGS_KEPT);
      logsUi.lastSeq = Math.max(logsUi.lastSeq, page.last_seq);
      renderLogDevices(page.devices);
      renderLogs(page);
    }
  } catch (err) {
    // The server went away for a moment: the next poll asks again.
  }
  if (asked === logsUi.asked && logsShown() && document.getElementById("logs-follow").checked) {
    logsUi.timer = setTimeout(() => refreshLogs(false), LOGS_POLL_MS);
  }
}

function renderLogDevices(devices) {
  if (devices.join() === logsUi.devices.join()) return;
  logsUi.devices = devices;
  const select = document.getElementById("logs-device");
  const chosen = select.value;
  select.replaceChildren(new Option("every device", ""), ...devices.map((d) => new Option(d, d)));
  select.value = devices.includes(chosen) ? chosen : "";
}

function logRow(line) {
  const tr = html("tr");
  Object.assign(tr.dataset, { seq: line.seq, device: line.device, level: line.level, round: line.round ?? "" });
  const when = new Date(line.time * 1000).toLocaleTimeString([], { hour12: false });
  const round = html("td", "", line.round === null ? "–" : `r${line.round}`);
  round.title = line.job ? `job ${line.job}` : "not in a job";
  const badgeCell = html("td");
  const badge = html("span", "badge", line.level);
  badge.style.background = line.level === "warning" ? COLORS.suspected : COLORS.failed;
  badgeCell.append(badge);
  const text = line.dropped ? `${line.line}  (${line.dropped} earlier lines dropped by the device's rate limit)` : line.line;
  const device = html("td", "", line.device);
  if (line.node !== null) device.append(html("div", "sub", `node ${line.node}`));
  tr.append(html("td", "", when), round, device, badgeCell, html("td", "line", text));
  tr.title = line.logger;
  return tr;
}

function renderLogs(page) {
  const body = document.querySelector("#logs tbody");
  document.getElementById("log-count").textContent = `${logsUi.lines.length} lines shown`
    + (page.unreadable ? ` · ${page.unreadable} unreadable` : "");
  if (!logsUi.lines.length) {
    const td = html("td", "empty", "No matching line: devices send their warnings and errors here.");
    td.colSpan = 5;
    body.replaceChildren(html("tr").appendChild(td).parentElement);
    return;
  }
  body.replaceChildren(...logsUi.lines.slice().reverse().map(logRow));
}

for (const id of ["logs-level", "logs-device", "logs-follow"]) {
  document.getElementById(id).addEventListener("change", () => refreshLogs(true));
}
document.getElementById("logs-q").addEventListener("input", () => refreshLogs(true));
window.addEventListener("hashchange", () => refreshLogs(true));
refreshLogs(true);
