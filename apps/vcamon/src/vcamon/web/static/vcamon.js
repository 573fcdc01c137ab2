// vcamon page: one temperature and one power chart per node, drawn with uPlot.
"use strict";

// Temperature lines never use the power chart's blue, orange or purple, so each line is told apart in a screenshot.
const COLORS = ["#d62728", "#2ca02c", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#17becf", "#000000"];

function query() {
  const p = new URLSearchParams(location.search);
  const form = document.getElementById("range");
  if (p.get("range")) form.range.value = p.get("range");
  return p;
}

function fmt(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

// Where a node's figures come from (its agent's platform): lab figures are the simulator's, never hardware's.
const PLATFORM = {
  lab: ["lab (simulated)", "figures from the lab simulator (lab/sim), not hardware"],
  hardware: ["hardware", "figures read on VCA hardware"],
  unknown: ["platform unknown", "no evidence of VCA hardware was found (or not recorded): not hardware figures"],
};

function badge(platform) {
  const kind = PLATFORM[platform] ? platform : "unknown";
  const [text, title] = PLATFORM[kind];
  return `<span class="badge ${kind}" data-platform="${kind}" title="${title}">${text}</span>`;
}

async function getJSON(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(resp.status === 401 ? "a token is required: open /?token=<token> once" :
    `${url}: HTTP ${resp.status}`);
  return resp.json();
}

const attr = text => String(text).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"})[c]);

// How old a figure is, said plainly; a section older than three rounds is marked stale.
function ago(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "never";
  const s = Math.max(0, Math.round(seconds));
  return s < 120 ? `${s} s ago` : s < 7200 ? `${Math.round(s / 60)} min ago` :
    s < 172800 ? `${Math.round(s / 3600)} h ago` : `${Math.round(s / 86400)} d ago`;
}

function age(section, seconds, what) {
  const el = document.querySelector(`.age[data-section="${section}"]`);
  el.textContent = `${what} ${ago(seconds)}`;
  el.dataset.seconds = seconds === null || seconds === undefined ? "" : Math.round(seconds);
  el.classList.toggle("stale", seconds === null || seconds === undefined || seconds > 3 * REFRESH_S);
}

function agentCell(n) {
  if (n.dead) return `<td class="dead" title="the inventory's dead group">dead</td>`;
  if (n.unknown) return `<td class="unknown" title="${attr(n.error)}">unknown</td>`;
  return `<td class="${n.up ? "" : "down"}"${n.auth_failed ? ` title="${attr(n.error)}"` : ""}>${n.up ? "up" : n.auth_failed ? "auth failed" : "down"}</td>`;
}

// With several VCA hosts, a row per host above its own agent and nodes: the host's state by its name
// (down: neither its agent nor any of its nodes answers; its nodes are then unknown, not down each).
const HOST_STATE = {up: "up", down: "down", "agent down": "its agent is down", "never seen": "never seen"};

function hostRow(h) {
  const bad = h.state !== "up";
  const why = bad ? ` title="agent: ${attr(h.error || "no answer")}${h.unknown.length ? "; its nodes unknown: " + attr(h.unknown.join(", ")) : ""}"` : "";
  return `<tr class="vca-host" data-host="${attr(h.host)}" data-state="${attr(h.state)}"><th colspan="9">${attr(h.host)}
    <span class="${bad ? "down" : ""}"${why}>${HOST_STATE[h.state] || attr(h.state)}</span></th></tr>`;
}

function statusTable(nodes, now, hosts) {
  const row = n => `<tr><td>${n.node}</td>
    ${agentCell(n)}<td>${n.platform ? badge(n.platform) : "–"}</td>
    <td>${n.vca_state || "–"}</td>
    <td>${fmt(n.hottest_c, 1)}</td><td>${fmt(n.power_w, 1)}</td><td>${fmt(n.pl1_w, 0)}/${fmt(n.pl2_w, 0)}</td>
    <td>${n.throttle_24h}</td><td>${n.last_seen ? (now - n.last_seen) + " s ago" : "never"}</td></tr>`;
  const rows = !(hosts && hosts.length) ? nodes.map(row) :
    hosts.map(h => hostRow(h) + nodes.filter(n => n.vca_host === h.host).map(row).join(""))
      .concat(nodes.filter(n => !n.vca_host).map(row));
  document.getElementById("status").innerHTML =
    "<tr><th>node</th><th>agent</th><th>platform</th><th>vcactl</th><th>hottest °C</th><th>package W</th><th>PL1/PL2 W</th>" +
    "<th>throttle 24 h</th><th>last seen</th></tr>" + rows.join("");
}

const when = ts => ts ? new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "–";

// The fleet's one page: what runs, the newest bench figures with their platform, what is open.
function fleetSections(f) {
  const oldest = [f.agents_at, f.scraped_at].some(t => !t) ? null : f.now - Math.min(f.agents_at, f.scraped_at);
  age("runs", oldest, "scraped");
  age("open", oldest, "as of");
  const newest = f.numbers.length ? f.now - Math.max(...f.numbers.map(r => r.at || 0)) : null;
  age("numbers", newest, "newest record");
  const hosted = f.runs.some(r => r.vca_host);
  const state = r => r.dead ? "dead" : r.up ? "up" : r.unknown ? "unknown" : "down";
  document.querySelector("#runs table").innerHTML =
    `<tr><th>service</th>${hosted ? "<th>host</th>" : ""}<th>node</th><th>state</th></tr>` +
    f.runs.map(r => `<tr data-service="${attr(r.service)}" data-node="${attr(r.node)}"><td>${attr(r.service)}</td>
      ${hosted ? `<td>${attr(r.vca_host || "–")}</td>` : ""}<td>${attr(r.node)}</td><td class="${r.dead ? "dead" : r.up ? "" : r.unknown ? "unknown" : "down"}" title="${attr(r.error || "")}">${state(r)}</td></tr>`).join("");
  document.querySelector("#numbers div").innerHTML = f.numbers.length === 0 ?
    `<p class="empty">no bench record yet: playbooks/bench/gemm.yml, dma.yml, capacity.yml</p>` :
    f.numbers.map(run => `<table data-kind="${run.kind}"><tr><th colspan="3">${run.kind}, ${when(run.at)}
      ${run.platform ? badge(run.platform.startsWith("mixed") ? "unknown" : run.platform) : ""}</th></tr>` +
      (run.error ? `<tr><td colspan="3" class="down">unreadable: ${attr(run.error)}</td></tr>` : "") +
      (run.figures.length === 0 && !run.error ? `<tr><td colspan="3" class="empty">no figure in this run</td></tr>` : "") +
      run.figures.map(x => `<tr class="figure" data-platform="${attr(x.platform || "unknown")}"><td>${attr(x.what)}</td>
        <td class="figure">${x.value} ${attr(x.unit)}</td><td>${badge(x.platform)}</td></tr>`).join("") + "</table>").join("");
  document.querySelector("#open ul").innerHTML = f.open.length === 0 ? `<li class="nothing">nothing open</li>` :
    f.open.map(i => `<li data-what="${attr(i.what)}"><b>${attr(i.what)}</b>: ${attr(i.where)}${i.detail ? " (" + attr(i.detail) + ")" : ""}</li>`).join("");
}

// Throttle events as red vertical lines (a span of them, ts to until_ts, as a red band), down periods
// starting with grey ones.
function eventMarks(events) {
  return u => {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    ctx.save();
    for (const e of events) {
      if (e.kind !== "throttle" && e.kind !== "down") continue;
      const x = Math.round(u.valToPos(e.ts, "x", true));
      if (e.kind === "throttle" && e.until_ts > e.ts) {
        const left = Math.max(x, u.bbox.left);
        const right = Math.min(Math.round(u.valToPos(e.until_ts, "x", true)), u.bbox.left + u.bbox.width);
        if (right >= left) {
          ctx.fillStyle = "rgba(214,39,40,0.25)";
          ctx.fillRect(left, top, Math.max(2, right - left), h);
        }
        continue;
      }
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = e.kind === "throttle" ? "rgba(214,39,40,0.8)" : "rgba(120,120,120,0.8)";
      ctx.lineWidth = e.kind === "throttle" ? 2 : 3;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
    }
    ctx.restore();
  };
}

function chart(el, title, unit, t, series, events) {
  const opts = {
    title, width: 560, height: 220,
    scales: { x: { time: true } },
    axes: [{}, { label: unit }],
    series: [{}].concat(series.map(s => Object.assign({ width: 1.5, spanGaps: false }, s.opts))),
    hooks: { draw: [eventMarks(events)] },
  };
  return new uPlot(opts, [t].concat(series.map(s => s.data)), el);
}

async function nodeCharts(main, node, span, host) {
  const box = document.createElement("section");
  box.className = "node";
  box.innerHTML = `<h2>${node}${host ? ` <span class="on-host">on ${attr(host)}</span>` : ""}</h2>`;
  main.appendChild(box);
  const params = new URLSearchParams({ node });
  if (span.from) { params.set("from", span.from); params.set("to", span.to); } else { params.set("range", span.range); }
  const data = await getJSON("/api/chart?" + params);
  const platforms = data.platforms || [];
  box.querySelector("h2").insertAdjacentHTML("beforeend", platforms.map(badge).join(""));
  const from = platforms.includes("lab") ? " · lab (simulated)" : "";
  if (!data.t || data.t.length === 0) {
    box.insertAdjacentHTML("beforeend", `<p class="empty">no samples in this range</p>`);
    return 0;
  }
  const temps = Object.keys(data.temps).map((label, i) => ({
    data: data.temps[label], opts: { label, stroke: COLORS[i % COLORS.length] } }));
  chart(box, `${node} temperature (${data.resolution})${from}`, "°C", data.t, temps, data.events);
  const power = [
    { data: data.power, opts: { label: "package W", stroke: "#1f77b4", fill: "rgba(31,119,180,0.1)" } },
    { data: data.pl1, opts: { label: "PL1", stroke: "#ff7f0e", dash: [6, 4] } },
    { data: data.pl2, opts: { label: "PL2", stroke: "#9467bd", dash: [2, 4] } },
  ];
  chart(box, `${node} power (${data.resolution})${from}`, "W", data.t, power, data.events);
  return data.t.length;
}

// The page reloads its figures every REFRESH_S (charts too, unless a fixed from/to is shown); a failed
// refresh keeps the last figures and says since when they are stale, never silently.
const REFRESH_S = 30;
let refreshes = 0;
let lastGood = null;

async function load(span) {
  const fleet = await getJSON("/api/fleet");
  const status = await getJSON("/api/nodes");
  fleetSections(fleet);
  statusTable(status.nodes, status.now, status.hosts);
  age("status", status.round_at ? status.now - status.round_at : null, "scraped");
  if (!span.from || refreshes === 0) {
    const charts = document.createElement("main");
    charts.id = "charts";
    let points = 0;
    document.getElementById("charts").replaceWith(charts);
    for (const n of status.nodes) points += await nodeCharts(charts, n.node, span, n.vca_host);
    document.body.dataset.points = points;
  }
  lastGood = Date.now();
  document.getElementById("updated").textContent =
    `updated ${new Date(lastGood).toISOString().slice(11, 19)} UTC, every ${REFRESH_S} s`;
  document.getElementById("updated").classList.remove("stale");
}

async function refresh(span) {
  try {
    await load(span);
    refreshes += 1;
    document.body.dataset.refreshes = refreshes;
  } catch (err) {
    const el = document.getElementById("updated");
    el.textContent = `stale: not updated for ${ago((Date.now() - lastGood) / 1000)} (${err})`;
    el.classList.add("stale");
    document.body.dataset.error = String(err);
  }
}

async function main() {
  const p = query();
  const span = { range: p.get("range") || "1h" };
  if (p.get("from")) {
    span.from = Math.floor(new Date(p.get("from")).getTime() / 1000);
    span.to = p.get("to") ? Math.floor(new Date(p.get("to")).getTime() / 1000) : Math.floor(Date.now() / 1000);
  }
  await load(span);
  document.body.dataset.ready = "1";
  setInterval(() => refresh(span), REFRESH_S * 1000);
}

document.getElementById("range").addEventListener("submit", ev => {
  ev.preventDefault();
  const f = ev.target, p = new URLSearchParams();
  if (f.from.value) { p.set("from", f.from.value); if (f.to.value) p.set("to", f.to.value); }
  else p.set("range", f.range.value);
  location.search = p.toString();
});

main().catch(err => {
  document.body.dataset.error = String(err);
  document.getElementById("charts").textContent = "failed: " + err;
});
