// The cairn console's page: asks the monitor's JSON API (mon/console.py) every REFRESH_MS and
// draws what it gets. Data from the cluster only ever becomes text nodes (textContent), never
// markup, so names are shown as written. Changes are POSTs with the session's CSRF token.
"use strict";

const REFRESH_MS = 2000;
const THROUGHPUT_MS = 10000;
const CSRF = document.body.dataset.csrf;
const SVG = "http://www.w3.org/2000/svg";
let page = "overview";
let latest = {};

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function replace(id, ...children) {
  document.getElementById(id).replaceChildren(...children);
}

function text(id, value) {
  document.getElementById(id).textContent = value;
}

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = !message;
  box.textContent = message || "";
}

async function api(op, params) {
  const query = params ? "?" + new URLSearchParams(params) : "";
  const response = await fetch(`/api/${op}${query}`, {credentials: "same-origin"});
  if (response.status === 401) { location.reload(); throw new Error("signed out"); }
  const body = await response.json();
  if (!response.ok) throw new Error(`${op}: ${body.message || body.error}`);
  return body;
}

async function change(op, body) {
  const response = await fetch(`/api/${op}`, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-Cairn-Csrf": CSRF},
    body: JSON.stringify(body)});
  const reply = await response.json();
  if (!response.ok) throw new Error(reply.message || reply.error);
  return reply;
}

function bytes(count) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = count, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

function rate(bytesPerS) {
  return `${(bytesPerS / 1e6).toFixed(1)} MB/s`;
}

// -- overview ------------------------------------------------------------------------------

function drawOverview() {
  const {status, tree, df} = latest;
  if (!status) return;
  const health = document.getElementById("health");
  health.textContent = status.health;
  health.className = status.health;
  replace("checks", ...Object.entries(status.checks).map(([name, summary]) =>
    el("li", {class: status.severities[name] === "HEALTH_ERR" ? "error" : ""},
       el("b", {}, name), ` (${status.severities[name]}): ${summary}`)));
  const osds = status.osds;
  text("osd-count", `${osds.total} OSDs: ${osds.up} up, ${osds.in} in`);
  if (tree) {
    replace("osd-list", ...tree.osds.map(osd => el("tr", {},
      el("td", {}, `osd.${osd.id}`), el("td", {}, osd.host || "-"),
      el("td", {class: osd.up ? "" : "down"}, osd.up ? "up" : "down"),
      el("td", {class: osd.in ? "" : "out"}, osd.in ? "in" : "out"))));
  }
  if (df) {
    const raw = df.raw;
    text("capacity", `${bytes(raw.used_bytes)} used of ${bytes(raw.total_bytes)} ` +
         `(${(100 * raw.used_ratio).toFixed(1)}%)`);
    const bar = document.getElementById("capacity-bar");
    bar.replaceChildren(svg("rect", {x: 0, y: 0, width: 320, height: 18, fill: "#e3e6ea"}),
                        svg("rect", {x: 0, y: 0, width: Math.round(320 * raw.used_ratio),
                                     height: 18, fill: raw.used_ratio > 0.85 ? "#c0262d" : "#4a8fe7"}));
  }
  text("pg-states", Object.entries(status.pg_states || {}).map(
    ([state, count]) => `${count} ${state}`).join(", ") || "no PGs");
  const objects = status.objects || {};
  text("objects", objects.total ? `${objects.total} object copies, ${objects.degraded} ` +
       `degraded, ${objects.misplaced} misplaced` : "");
}

function drawThroughput(samples) {
  const chart = document.getElementById("throughput");
  const width = 760, height = 180, left = 40, bottom = 20;
  chart.replaceChildren();
  if (!samples.length) {
    text("throughput-note", "No samples yet: the leader takes one every 10 s from the OSDs' heartbeats.");
    return;
  }
  text("throughput-note", `${samples.length} samples, the newest at ` +
       new Date(samples[samples.length - 1].at * 1000).toLocaleTimeString());
  const fields = [["client_in", "#4a8fe7"], ["client_out", "#17803d"], ["recovery", "#b26a00"]];
  const top = Math.max(1e6, ...samples.flatMap(s => fields.map(([f]) => s[f])));
  const start = samples[0].at, span = Math.max(1, samples[samples.length - 1].at - start);
  const x = at => left + (width - left - 5) * (at - start) / span;
  const y = value => height - bottom - (height - bottom - 5) * value / top;
  chart.append(svg("line", {x1: left, y1: y(0), x2: width, y2: y(0), stroke: "#999"}));
  const label = svg("text", {x: 2, y: 12});
  label.textContent = (top / 1e6).toFixed(1);
  chart.append(label);
  for (const [field, colour] of fields) {
    const points = samples.map(s => `${x(s.at).toFixed(1)},${y(s[field]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", {points, fill: "none", stroke: colour, "stroke-width": 2}));
  }
}

// -- OSDs ----------------------------------------------------------------------------------

function drawTree() {
  const {tree, perf, status} = latest;
  if (!tree) return;
  const latency = {};
  for (const osd of (perf ? perf.osds : [])) latency[osd.id] = osd.device || {};
  const lossy = new Set();
  for (const [name, summary] of Object.entries(status ? status.checks : {})) {
    if (name.startsWith("NETWORK_")) {
      for (const osd of tree.osds) if (osd.host && summary.includes(osd.host)) lossy.add(osd.host);
    }
  }
  const rows = [el("tr", {}, ...["host / OSD", "status", "weight", "reweight", "read ms",
                                  "write ms"].map(h => el("th", {}, h)))];
  const hosts = {};
  for (const osd of tree.osds) (hosts[osd.host || "-"] ||= []).push(osd);
  for (const host of Object.keys(hosts).sort()) {
    rows.push(el("tr", {}, el("td", {}, el("b", {}, host),
                              lossy.has(host) ? el("span", {class: "mark"}, "loss") : null)));
    for (const osd of hosts[host]) {
      const device = latency[osd.id] || {};
      const ms = kind => device[kind] && device[kind].ops ? device[kind].mean_ms.toFixed(2) : "-";
      const actions = el("td", {});
      const toggle = el("button", {}, osd.in ? "mark out" : "mark in");
      toggle.addEventListener("click", () => act("osd_mark", {id: osd.id, state: osd.in ? "out" : "in"}));
      actions.append(toggle);
      rows.push(el("tr", {},
        el("td", {}, `\u00a0\u00a0osd.${osd.id}`, osd.slow ? el("span", {class: "mark"}, "slow") : null),
        el("td", {class: osd.up && osd.in ? "" : "down"},
           `${osd.up ? "up" : "down"}, ${osd.in ? "in" : "out"}${osd.full ? ", full" : ""}`),
        el("td", {}, osd.weight), el("td", {}, osd.reweight), el("td", {}, ms("read")),
        el("td", {}, ms("write")), actions));
    }
  }
  replace("tree", ...rows);
}

// -- pools ---------------------------------------------------------------------------------

function drawPools() {
  const {pools, df, status} = latest;
  if (!pools) return;
  const usage = {};
  for (const pool of (df ? df.pools : [])) usage[pool.name] = pool;
  const rows = [el("tr", {}, ...["pool", "kind", "objects", "stored", "quota", "PGs"].map(
    h => el("th", {}, h)))];
  for (const pool of pools.pools) {
    const used = usage[pool.name] || {};
    const kind = pool.kind === "replicated" ? `replicated, size ${pool.size}` :
      `erasure ${pool.k}+${pool.m}${pool.fast_read ? ", fast read" : ""}`;
    const quota = [pool.max_objects ? `${used.objects || 0} / ${pool.max_objects} objects` : null,
                   pool.max_bytes ? `${bytes(used.stored_bytes || 0)} / ${bytes(pool.max_bytes)}` : null]
      .filter(Boolean).join(", ") || "none";
    const pgs = (status && status.pgs && status.pgs[pool.name]) || {};
    rows.push(el("tr", {}, el("td", {}, pool.name), el("td", {}, kind),
                 el("td", {}, used.objects ?? "-"), el("td", {}, used.stored_bytes === undefined ? "-" : bytes(used.stored_bytes)),
                 el("td", {}, quota),
                 el("td", {}, pgs.total === undefined ? "-" :
                    `${pgs.total}, ${pgs.degraded} degraded, ${pgs.unavailable} unavailable`)));
  }
  replace("pool-table", ...rows);
}

document.getElementById("pool-create").addEventListener("submit", async event => {
  event.preventDefault();
  const form = new FormData(event.target);
  const request = {name: form.get("name"), pg_num: Number(form.get("pg_num")),
                   failure_domain: form.get("failure_domain"), kind: form.get("kind")};
  if (request.kind === "replicated") request.size = Number(form.get("size"));
  else {
    const [k, m] = String(form.get("km")).split("+").map(Number);
    request.k = k; request.m = m;
  }
  try {
    const reply = await change("pool_create", request);
    text("pool-result", `created pool ${reply.pool.name} (epoch ${reply.epoch})`);
    await refresh();
  } catch (error) {
    text("pool-result", `refused: ${error.message}`);
  }
});

// -- recovery ------------------------------------------------------------------------------

let recoveryFormFilled = false;

async function drawRecovery() {
  const {status} = latest;
  if (!status) return;
  const recovery = status.recovery;
  const cluster = recovery.cluster_max_bytes_per_s;
  text("recovery-rate", `${rate(recovery.bytes_per_s)} now` +
       (cluster ? ` of ${rate(cluster)} for the cluster (${recovery.recovering_osds} OSDs recovering)` :
        ", no cluster-wide budget") +
       `; per OSD ${recovery.max_bytes_per_s ? rate(recovery.max_bytes_per_s) : "unlimited"}, ` +
       `${recovery.max_active} PGs at once (window: ${recovery.window})`);
  const objects = status.objects || {};
  text("recovery-progress", objects.total ? `${objects.degraded} of ${objects.total} object ` +
       `copies to recover, ${objects.misplaced} to move` : "");
  if (!recoveryFormFilled) {
    recoveryFormFilled = true;
    const values = await Promise.all(["recovery.cluster_max_bytes_per_s", "recovery.max_bytes_per_s",
                                      "recovery.windows"].map(key => api("config_get", {key})));
    const form = document.getElementById("recovery-budget");
    form.cluster.value = values[0].value;
    form.per_osd.value = values[1].value;
    document.getElementById("recovery-windows").windows.value =
      typeof values[2].value === "string" ? values[2].value : JSON.stringify(values[2].value);
  }
}

document.getElementById("recovery-budget").addEventListener("submit", async event => {
  event.preventDefault();
  const form = event.target;
  try {
    await change("config_set", {key: "recovery.cluster_max_bytes_per_s", value: form.cluster.value});
    await change("config_set", {key: "recovery.max_bytes_per_s", value: form.per_osd.value});
    text("recovery-result", "budgets saved");
  } catch (error) {
    text("recovery-result", `refused: ${error.message}`);
  }
});

document.getElementById("recovery-windows").addEventListener("submit", async event => {
  event.preventDefault();
  try {
    await change("config_set", {key: "recovery.windows", value: event.target.windows.value});
    text("recovery-result", "windows saved");
  } catch (error) {
    text("recovery-result", `refused: ${error.message}`);
  }
});

// -- plumbing ------------------------------------------------------------------------------

async function act(op, body) {
  try {
    await change(op, body);
    showError("");
    await refresh();
  } catch (error) {
    showError(`${op} refused: ${error.message}`);
  }
}

async function refresh() {
  try {
    const [status, tree, df, pools, perf] = await Promise.all(
      [api("status"), api("osd_tree"), api("df"), api("pool_ls"), api("osd_perf")]);
    latest = {status, tree, df, pools, perf};
    showError("");
  } catch (error) {
    showError(`the monitor did not answer: ${error.message}`);
    return;
  }
  drawOverview();
  drawTree();
  drawPools();
  if (page === "recovery") await drawRecovery();
}

async function refreshThroughput() {
  try {
    drawThroughput((await api("throughput")).samples);
  } catch (error) {
    text("throughput-note", `no throughput: ${error.message}`);
  }
}

for (const button of document.querySelectorAll("nav button")) {
  button.addEventListener("click", () => {
    page = button.dataset.page;
    for (const other of document.querySelectorAll("nav button")) other.classList.toggle("active", other === button);
    for (const section of document.querySelectorAll("main section")) section.hidden = section.id !== page;
    refresh();
  });
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/logout", {method: "POST", credentials: "same-origin"});
  location.reload();
});

refresh();
refreshThroughput();
setInterval(refresh, REFRESH_MS);
setInterval(refreshThroughput, THROUGHPUT_MS);
