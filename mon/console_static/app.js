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
  const clock = at => new Date(at * 1000).toLocaleTimeString();
  const first = svg("text", {x: left, y: height - 4});
  first.textContent = clock(start);
  const last = svg("text", {x: width - 5, y: height - 4, "text-anchor": "end"});
  last.textContent = clock(start + span);
  chart.append(first, last);
  for (const [field, colour] of fields) {
    const points = samples.map(s => `${x(s.at).toFixed(1)},${y(s[field]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", {points, fill: "none", stroke: colour, "stroke-width": 2}));
  }
}

// -- OSDs ----------------------------------------------------------------------------------

function drawTree() {
  const {tree, perf, health} = latest;
  if (!tree) return;
  const latency = {};
  for (const osd of (perf ? perf.osds : [])) latency[osd.id] = osd.device || {};
  // The hosts a network check names, from its detail lines ("hosts A and B: ...", "host H
  // loses packets to every peer host").
  const lossy = new Set();
  for (const [name, check] of Object.entries(health ? health.checks : {})) {
    if (!name.startsWith("NETWORK_")) continue;
    for (const line of check.detail || []) {
      const pair = /^hosts (\S+) and (\S+):/.exec(line), one = /^host (\S+) loses/.exec(line);
      if (pair) { lossy.add(pair[1]); lossy.add(pair[2]); }
      if (one) lossy.add(one[1]);
    }
  }
  const rows = [el("tr", {}, ...["host / OSD", "status", "weight", "reweight", "read ms",
                                  "write ms"].map(h => el("th", {}, h)))];
  const hosts = {};
  for (const osd of tree.osds) (hosts[osd.host || "-"] ||= []).push(osd);
  for (const host of Object.keys(hosts).sort()) {
    rows.push(el("tr", {}, el("td", {}, el("b", {}, host), " ",
                              lossy.has(host) ? el("span", {class: "mark"}, "loss") : null)));
    for (const osd of hosts[host]) {
      const device = latency[osd.id] || {};
      const ms = kind => device[kind] && device[kind].ops ? device[kind].mean_ms.toFixed(2) : "-";
      const actions = el("td", {});
      const toggle = el("button", {}, osd.in ? "mark out" : "mark in");
      toggle.addEventListener("click", () => act("osd_mark", {id: osd.id, state: osd.in ? "out" : "in"}));
      actions.append(toggle);
      rows.push(el("tr", {},
        el("td", {}, `\u00a0\u00a0osd.${osd.id} `, osd.slow ? el("span", {class: "mark"}, "slow") : null),
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

// -- users ---------------------------------------------------------------------------------

async function drawUsers() {
  let entities;
  try {
    entities = (await api("auth_ls")).entities;
  } catch (error) {
    replace("user-table", el("tr", {}, el("td", {}, `cannot list users: ${error.message}`)));
    return;
  }
  const rows = [el("tr", {}, el("th", {}, "entity"), el("th", {}, "caps"), el("th", {}, ""))];
  for (const entry of entities) {
    const revoke = el("button", {}, "revoke");
    revoke.addEventListener("click", async () => {
      if (!confirm(`Revoke ${entry.entity}? Its key stops working at once.`)) return;
      try {
        await change("auth_rm", {entity: entry.entity});
        text("user-result", `revoked ${entry.entity}`);
      } catch (error) {
        text("user-result", `refused: ${error.message}`);
      }
      drawUsers();
    });
    rows.push(el("tr", {}, el("td", {}, entry.entity), el("td", {}, entry.caps.join("; ")),
                 el("td", {}, entry.entity.startsWith("client.") ? revoke : "")));
  }
  replace("user-table", ...rows);
}

document.getElementById("user-add").addEventListener("submit", async event => {
  event.preventDefault();
  const form = new FormData(event.target);
  let cap = `osd=${form.get("perms")}`;
  if (form.get("pool")) cap += ` pool=${form.get("pool")}`;
  if (form.get("prefix")) cap += ` prefix=${form.get("prefix")}`;
  const caps = [cap];
  if (form.get("mon")) caps.push("mon=r");
  const entity = `client.${form.get("name")}`;
  try {
    const reply = await change("auth_add", {entity, caps});
    const link = el("a", {href: URL.createObjectURL(new Blob([reply.keyring], {type: "text/plain"})),
                          download: `${entity}.keyring`, id: "keyring-download"},
                    `download ${entity}.keyring`);
    replace("user-result", `added ${entity} (${reply.caps.join("; ")}): `, link,
            " (shown once: keep it safe)");
  } catch (error) {
    text("user-result", `refused: ${error.message}`);
  }
  drawUsers();
});

// -- allowlists ----------------------------------------------------------------------------

function drawAllowlists() {
  const {pools} = latest;
  if (!pools) return;
  const rows = [el("tr", {}, ...["pool", "path", "addresses", ""].map(h => el("th", {}, h)))];
  for (const pool of pools.pools) {
    for (const [prefix, networks] of Object.entries(pool.allow_from || {})) {
      const remove = el("button", {}, "remove");
      remove.addEventListener("click", () => setAllowlist(pool.name, prefix, []));
      rows.push(el("tr", {}, el("td", {}, pool.name), el("td", {}, prefix || "(the whole pool)"),
                   el("td", {}, networks.join(", ")), el("td", {}, remove)));
    }
  }
  if (rows.length === 1) rows.push(el("tr", {}, el("td", {}, "no allowlists: every address may use every pool")));
  replace("allow-table", ...rows);
}

async function setAllowlist(pool, prefix, networks) {
  try {
    await change("pool_allow_from", {name: pool, prefix, networks});
    text("allow-result", networks.length ? `${pool}/${prefix}: ${networks.join(", ")}` :
         `${pool}/${prefix}: allowlist removed`);
    await refresh();
  } catch (error) {
    text("allow-result", `refused: ${error.message}`);
  }
}

document.getElementById("allow-set").addEventListener("submit", event => {
  event.preventDefault();
  const form = new FormData(event.target);
  const networks = String(form.get("networks")).split(",").map(n => n.trim()).filter(Boolean);
  setAllowlist(form.get("pool"), form.get("prefix"), networks);
});

// -- expansion -----------------------------------------------------------------------------

async function drawExpansion() {
  const {tree, status} = latest;
  if (!tree) return;
  const full = Math.max(1, ...tree.osds.map(osd => osd.weight));
  const joining = tree.osds.filter(osd => osd.weight < full);
  const rows = [el("tr", {}, ...["OSD", "host", "weight", "progress"].map(h => el("th", {}, h)))];
  for (const osd of joining) {
    const bar = svg("svg", {width: 200, height: 12});
    bar.append(svg("rect", {x: 0, y: 0, width: 200, height: 12, fill: "#e3e6ea"}),
               svg("rect", {x: 0, y: 0, width: Math.round(200 * osd.weight / full), height: 12, fill: "#4a8fe7"}));
    rows.push(el("tr", {}, el("td", {}, `osd.${osd.id}`), el("td", {}, osd.host || "-"),
                 el("td", {}, `${osd.weight.toFixed(3)} of ${full}`), el("td", {}, bar)));
  }
  if (!joining.length) rows.push(el("tr", {}, el("td", {}, "every OSD is at full weight: no expansion under way")));
  replace("joining", ...rows);
  const objects = (status && status.objects) || {};
  text("moving", objects.total ? `${objects.misplaced} of ${objects.total} object copies still ` +
       `to move, ${objects.degraded} to recover` : "");
  try {
    const events = (await api("audit_read", {limit: 2000})).events
      .filter(e => e.op === "osd_mark" && / (re)?weight /.test(e.target || "")).reverse();
    replace("steps", el("tr", {}, ...["time", "change", "by", "result"].map(h => el("th", {}, h))),
            ...events.slice(0, 100).map(e => el("tr", {},
              el("td", {}, new Date(e.time * 1000).toLocaleString()), el("td", {}, e.target),
              el("td", {}, e.entity), el("td", {}, e.result))));
  } catch (error) {
    replace("steps", el("tr", {}, el("td", {}, `no steps: ${error.message}`)));
  }
}

// -- alerts --------------------------------------------------------------------------------

async function webhooks() {
  // Unset, the option reads as its default in JSON ("[]"); set, as the text given (URL,URL).
  const value = String((await api("config_get", {key: "alert.webhooks"})).value || "");
  if (value.startsWith("[")) return JSON.parse(value);
  return value.split(",").map(u => u.trim()).filter(Boolean);
}

async function saveWebhooks(urls, message) {
  try {
    await change("config_set", {key: "alert.webhooks", value: urls.join(",")});
    text("webhook-result", message);
  } catch (error) {
    text("webhook-result", `refused: ${error.message}`);
  }
  drawAlerts();
}

async function drawAlerts() {
  try {
    const urls = await webhooks();
    const rows = [el("tr", {}, el("th", {}, "URL"), el("th", {}, ""))];
    for (const url of urls) {
      const test = el("button", {}, "send a test");
      test.addEventListener("click", async () => {
        try {
          const reply = await change("alert_test", {url});
          text("webhook-result", `test sent to ${url}: ${reply.outcome}`);
        } catch (error) {
          text("webhook-result", `test to ${url} failed: ${error.message}`);
        }
      });
      const remove = el("button", {}, "remove");
      remove.addEventListener("click", () => saveWebhooks(urls.filter(u => u !== url), `removed ${url}`));
      rows.push(el("tr", {}, el("td", {}, url), el("td", {}, test, " ", remove)));
    }
    if (!urls.length) rows.push(el("tr", {}, el("td", {}, "no webhooks")));
    replace("webhook-table", ...rows);
    const events = (await api("health_history", {limit: 200})).events.reverse();
    replace("history", el("tr", {}, ...["time", "check", "state", "severity", "summary"].map(h => el("th", {}, h))),
            ...events.map(e => el("tr", {}, el("td", {}, new Date(e.time * 1000).toLocaleString()),
                                  el("td", {}, e.check), el("td", {class: e.state === "raised" ? "error" : ""}, e.state),
                                  el("td", {}, e.severity), el("td", {}, e.summary))));
  } catch (error) {
    text("webhook-result", `cannot read alerts: ${error.message}`);
  }
}

document.getElementById("webhook-add").addEventListener("submit", async event => {
  event.preventDefault();
  const url = new FormData(event.target).get("url").trim();
  if (url) saveWebhooks([...(await webhooks()), url], `added ${url}`);
});

// -- audit ---------------------------------------------------------------------------------

async function drawAudit() {
  const form = new FormData(document.getElementById("audit-filter"));
  const params = {limit: 1000};
  if (form.get("entity")) params.entity = form.get("entity");
  if (Number(form.get("since"))) params.since = Math.floor(Date.now() / 1000) - Number(form.get("since"));
  const op = form.get("op");
  try {
    const events = (await api("audit_read", params)).events.filter(e => !op || e.op === op).reverse();
    replace("audit-table", el("tr", {}, ...["time", "entity", "from", "op", "target", "result"].map(h => el("th", {}, h))),
            ...events.map(e => el("tr", {}, el("td", {}, new Date(e.time * 1000).toLocaleString()),
                                  el("td", {}, e.entity), el("td", {}, e.addr || "-"), el("td", {}, e.op),
                                  el("td", {}, e.target ?? ""), el("td", {class: e.result === "ok" ? "" : "error"}, e.result))));
  } catch (error) {
    replace("audit-table", el("tr", {}, el("td", {}, `cannot read the audit log: ${error.message}`)));
  }
}

document.getElementById("audit-filter").addEventListener("submit", event => {
  event.preventDefault();
  drawAudit();
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
    const [status, tree, df, pools, perf, health] = await Promise.all(
      [api("status"), api("osd_tree"), api("df"), api("pool_ls"), api("osd_perf"),
       api("health")]);
    latest = {status, tree, df, pools, perf, health};
    showError("");
  } catch (error) {
    showError(`the monitor did not answer: ${error.message}`);
    return;
  }
  drawOverview();
  drawTree();
  drawPools();
  drawAllowlists();
  if (page === "recovery") await drawRecovery();
  if (page === "expansion") await drawExpansion();
}

// Pages drawn when opened (and by their own buttons), not every REFRESH_MS: they hold forms or
// long lists a refresh would disturb.
const ON_OPEN = {users: drawUsers, alerts: drawAlerts, audit: drawAudit};

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
    if (ON_OPEN[page]) ON_OPEN[page]();
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
