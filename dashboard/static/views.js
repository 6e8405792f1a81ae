// The devices and jobs views (#devices, #jobs): every device whose record the broker holds, and
// every job with its devices' execution states, from /api/devices and /api/jobs, polled while
// a view is shown. The fleet view (#fleet, the default) is the job this dashboard follows.
// Loaded after app.js; uses its globals (html, el, COLORS, fmtBytes, fmtPct, model) and charts.js's
// NODE_COLORS; two or more jobs' accuracy curves can be laid over one another (uPlot).
"use strict";

const DIRECTORY_POLL_MS = 2000;
const VIEWS = ["fleet", "devices", "jobs", "logs"]; // logs: logs.js
const directory = { view: "fleet", timer: null, asked: 0, compare: new Set(), jobs: [], curves: null, curvesKey: "" };

function showView() {
  const asked = location.hash.replace(/^#/, "");
  directory.view = VIEWS.includes(asked) ? asked : "fleet";
  document.getElementById("main").dataset.view = directory.view;
  for (const tab of document.querySelectorAll("[data-view-tab]")) {
    if (tab.dataset.viewTab === directory.view) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  clearTimeout(directory.timer);
  if (directory.view === "devices" || directory.view === "jobs") refreshDirectory();
  else scheduleRender(); // the charts take their width again
}

async function refreshDirectory() {
  const view = directory.view;
  const asked = ++directory.asked;
  try {
    const reply = await fetch(view === "devices" ? "/api/devices" : "/api/jobs");
    if (reply.ok && asked === directory.asked && view === directory.view) {
      const items = await reply.json();
      if (view === "devices") renderDevices(items); else renderJobs(items);
    }
  } catch (err) {
    // The server went away for a moment: the next poll asks again.
  }
  if (asked === directory.asked && (directory.view === "devices" || directory.view === "jobs")) {
    directory.timer = setTimeout(refreshDirectory, DIRECTORY_POLL_MS);
  }
}

function badge(text, colourKey) {
  const b = html("span", "badge", text.replace(/_/g, " "));
  b.style.background = COLORS[colourKey] || COLORS.unknown;
  return b;
}

function cell(content, cls = "") {
  const td = html("td", cls);
  for (const part of [].concat(content)) td.append(part);
  return td;
}

function fmtWhen(unix) {
  if (unix === null || unix === undefined || unix <= 0) return "–";
  return new Date(unix * 1000).toLocaleString([], { hour12: false, dateStyle: "short", timeStyle: "medium" });
}

function fmtAgo(unix) {
  if (!unix) return "–";
  const s = Math.max(0, Date.now() / 1000 - unix);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : fmtWhen(unix);
}

function chips(texts) {
  const box = html("div", "chips");
  for (const text of texts) box.append(html("span", "chip", text));
  return box;
}

function renderDevices(devices) {
  document.getElementById("device-count").textContent = `${devices.length} devices · `
    + `${devices.filter((d) => d.job).length} training`;
  const body = document.querySelector("#devices tbody");
  if (!devices.length) {
    const td = html("td", "empty", "No device record on the broker yet (edgegrove device publishes one).");
    td.colSpan = 9;
    body.replaceChildren(html("tr").appendChild(td).parentElement);
    return;
  }
  body.replaceChildren(...devices.map((d) => {
    const tr = html("tr");
    Object.assign(tr.dataset, { device: d.id, state: d.state, job: d.job || "" });
    const sources = d.data.map((s) => `${s.name} · ${s.samples} samples${s.error ? ` (${s.error})` : ""}`);
    const job = d.job ? [html("span", "", d.job), html("div", "sub", `node ${d.node ?? "?"}`)]
      : [html("span", "sub", d.queued.length ? `${d.queued.length} queued` : "none")];
    tr.append(
      cell([html("strong", "", d.id), html("div", "sub", [d.version ? `v${d.version}` : "", d.arch].filter(Boolean).join(" · "))]),
      cell(badge(d.state, KINDS.deviceBadge[d.state])),
      cell(job),
      cell(chips(Object.entries(d.labels).map(([k, v]) => `${k}=${v}`))),
      cell(`${d.arch || "–"}${d.cores ? ` · ${d.cores} cores` : ""}`, "wide"),
      cell(chips(d.backends), "wide"),
      cell(chips(sources), "wide"),
      cell(d.memory ? `${fmtBytes(d.memory_available)} free of ${fmtBytes(d.memory)}` : "–", "wide"),
      cell([html("span", "", fmtAgo(d.heard_at)), html("div", "sub", `record ${fmtWhen(d.last_seen)}`)]),
    );
    return tr;
  }));
}

function curveSvg(curve) {
  // The accuracy the devices reported, round by round: a line over the job's rounds.
  const svg = el("svg", { class: "curve", viewBox: "0 0 120 28", preserveAspectRatio: "none" });
  if (curve.length < 2) return svg;
  const r0 = curve[0][0];
  const r1 = curve[curve.length - 1][0];
  const points = curve.map(([r, a]) => `${(118 * (r - r0)) / Math.max(1, r1 - r0) + 1},${27 - 26 * a}`);
  el("polyline", { points: points.join(" ") }, svg);
  return svg;
}

function execChip(e) {
  const chip = html("span", "chip", `${e.device} ${e.state.replace(/_/g, " ")}`);
  chip.dataset.state = e.state;
  chip.style.background = COLORS[KINDS.execBadge[e.state]] || COLORS.unknown;
  chip.title = [`node ${e.node ?? "?"}`, e.round !== null ? `round ${e.round}` : "", e.accuracy !== null ? fmtPct(e.accuracy) : "",
    e.reason || "", e.detail].filter(Boolean).join(" · ");
  return chip;
}

function renderJobs(jobs) {
  const running = jobs.filter((j) => j.state === "running").length;
  document.getElementById("job-count").textContent = `${jobs.length} jobs · ${running} running`;
  const body = document.querySelector("#jobs tbody");
  if (!jobs.length) {
    const td = html("td", "empty", "No job on the broker yet (edgegrove job submit publishes one).");
    td.colSpan = 10;
    body.replaceChildren(html("tr").appendChild(td).parentElement);
    return;
  }
  body.replaceChildren(...jobs.map((j) => {
    const tr = html("tr");
    Object.assign(tr.dataset, { job: j.name, state: j.state });
    const name = [html("strong", "", j.name), html("div", "sub", [j.model, j.data, j.algorithm].filter(Boolean).join(" · "))];
    if (model.fleet && model.fleet.job === j.name) {
      const link = html("a", "sub", "fleet view");
      link.href = "#fleet";
      name.push(link);
    }
    const devices = html("div", "chips");
    devices.append(...j.devices.map(execChip));
    tr.append(
      cell(name),
      cell(badge(j.state, KINDS.jobBadge[j.state])),
      cell(devices),
      cell(j.round === null ? "–" : `${j.round}${j.rounds_planned ? ` / ${j.rounds_planned}` : ""}`),
      cell(fmtPct(j.accuracy)),
      cell(curveSvg(j.curve), "wide"),
      cell(fmtWhen(j.started_at), "wide"),
      cell(j.ended_at === null ? (j.state === "running" ? "running" : "–") : fmtWhen(j.ended_at), "wide"),
      cell(j.submitted_by || "–", "wide"),
      cell(compareBox(j.name)),
    );
    return tr;
  }));
  directory.jobs = jobs;
  renderJobCurves();
}

function compareBox(name) {
  const label = html("label", "check");
  const box = html("input");
  box.type = "checkbox";
  box.dataset.compare = name;
  box.checked = directory.compare.has(name);
  box.setAttribute("aria-label", `lay ${name}'s accuracy curve over the others'`);
  label.append(box);
  return label;
}

function renderJobCurves() {
  // The picked jobs' accuracy by round on one chart (rounds the devices reported).
  const picked = directory.jobs.filter((j) => directory.compare.has(j.name) && j.curve.length);
  const box = document.getElementById("job-curves");
  const key = JSON.stringify(picked.map((j) => [j.name, j.curve]));
  box.dataset.jobs = picked.map((j) => j.name).join(",");
  document.getElementById("job-curves-hint").hidden = picked.length > 0;
  if (key === directory.curvesKey && (picked.length === 0 || directory.curves)) return;
  directory.curvesKey = key;
  if (directory.curves) { directory.curves.destroy(); directory.curves = null; }
  box.replaceChildren();
  if (!picked.length) return;
  const xs = [...new Set(picked.flatMap((j) => j.curve.map(([r]) => r)))].sort((a, b) => a - b);
  const columns = picked.map((j) => { const at = new Map(j.curve); return xs.map((x) => (at.has(x) ? at.get(x) : null)); });
  const width = Math.max(240, box.parentElement.clientWidth - 8);
  directory.curves = new uPlot({
    width, height: 200, legend: { show: true }, scales: { x: { time: false }, y: { range: [0, 1] } },
    axes: [{ stroke: "#6b7280", size: 30 }, { stroke: "#6b7280", size: 44, values: (u, ticks) => ticks.map((t) => `${Math.round(t * 100)}`) }],
    series: [{ label: "round" }, ...picked.map((j, k) => ({
      label: j.name, stroke: NODE_COLORS[k % NODE_COLORS.length], width: 2, spanGaps: true,
      points: { show: true, size: 5, fill: NODE_COLORS[k % NODE_COLORS.length] },
      value: (u, v) => (v === null ? "–" : fmtPct(v)),
    }))],
  }, [xs, ...columns], box);
}

window.addEventListener("hashchange", showView);
document.getElementById("jobs").addEventListener("change", (e) => {
  const name = e.target.dataset ? e.target.dataset.compare : undefined;
  if (name === undefined) return;
  if (e.target.checked) directory.compare.add(name); else directory.compare.delete(name);
  renderJobCurves();
});
showView();
