// smem console: reads the public HTTP API with the token typed in (kept in sessionStorage). Every datum
// goes into the page as text (textContent / Text nodes), never as HTML.
"use strict";

const KEY = "smem.token";
const API = location.pathname.replace(/\/console(\/.*)?$/, "");   // the API lives where /console/ is mounted
const $ = id => document.getElementById(id);
let token = null, ns = null;

// --- small helpers -----------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

// Stored times are "YYYY-MM-DDTHH:MM:SS.ffffffZ" (UTC): shown to the second (a date alone at midnight), the
// exact value kept in datetime and title.
function when(iso, open) {
  if (!iso) return el("span", { class: "open" }, open || "—");
  const short = iso.replace("T", " ").replace(/\.\d+Z$/, "Z").replace(/ 00:00:00Z$/, "");
  return el("time", { datetime: iso, title: iso }, short);
}

// One microsecond before a stored time: the asOf at which the fact a newer one superseded was still in force.
function justBefore(iso) {
  const m = /^(.*)\.(\d{6})Z$/.exec(iso);
  if (!m) return new Date(Date.parse(iso) - 1).toISOString();
  const us = Number(m[2]);
  if (us > 0) return m[1] + "." + String(us - 1).padStart(6, "0") + "Z";
  return new Date(Date.parse(m[1] + "Z") - 1).toISOString().replace(/Z$/, "999Z");
}

function nsPath(rest) { return "/v5/ns/" + encodeURIComponent(ns) + rest; }

async function api(path, body) {
  const headers = { Authorization: "Bearer " + token };
  const opts = { headers, cache: "no-store" };
  if (body !== undefined) {
    opts.method = "POST";
    opts.body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(API + path, opts);
  let data = null;
  try { data = await resp.json(); } catch { /* not JSON: the status says enough */ }
  if (!resp.ok) {
    const err = new Error(`${resp.status}: ${(data && data.error) || resp.statusText}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function showError(msg) {
  const p = $("error");
  p.textContent = msg;
  p.hidden = !msg;
}

function rows(table, list, empty, cols) {
  const tbody = $(table).tBodies[0];
  tbody.replaceChildren(...list);
  if (!list.length) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: cols }, empty)));
}

// --- the fragment: #token=...&ns=...&q=...&mode=... (for scripted use) -------------------------------

function readFragment() {
  const f = new URLSearchParams(location.hash.slice(1));
  if (f.has("token")) {
    sessionStorage.setItem(KEY, f.get("token"));
    f.delete("token");
    const rest = f.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
  }
  return f;
}

// --- the sections ------------------------------------------------------------------------------------

function jobText(d) {
  if (!d.job || d.job.state === "done") return when(null);
  const tries = d.job.attempts ? ` after ${d.job.attempts} failed attempt${d.job.attempts > 1 ? "s" : ""}` : "";
  return `${d.job.state} at ${d.job.stage}${tries}`;
}

async function loadDocuments() {
  const data = await api(nsPath("/documents?limit=200"));
  $("doc-count").textContent = data.total > data.documents.length ? `${data.documents.length} of ${data.total}`
    : String(data.total);
  rows("documents", data.documents.map(d => el("tr", { "data-id": d.id },
    el("td", null, el("span", { class: "name" }, d.customId || d.id), d.customId ? el("span", { class: "id" }, d.id)
      : null),
    el("td", null, el("span", { class: "status " + d.status }, d.status)),
    el("td", { class: "num" }, d.chunks),
    el("td", { class: "span" }, when(d.updatedAt)),
    el("td", { class: "job" }, jobText(d)),
    el("td", d.error ? { class: "err" } : null, d.error || when(null)))), "no documents", 6);
}

function historyList(events) {
  return el("ul", { class: "history" }, ...(events || []).map(h => el("li", null,
    el("b", null, h.event), " ", when(h.at),
    h.otherId ? el("span", { class: "id" }, (h.event === "created" ? "supersedes " :
      h.event === "superseded" ? "by " : "") + h.otherId) : null)));
}

function factRow(m, superseded) {
  return el("tr", { class: superseded ? "superseded" : "current", "data-id": m.id },
    el("td", null,
      superseded ? el("span", { class: "tag superseded" }, "superseded") : null,
      el("span", { class: "fact" }, m.content),
      el("span", { class: "id" }, m.id + (m.origin ? " · " + m.origin : "") +
        (m.documentId ? " · from " + m.documentId : ""))),
    el("td", { class: "span" }, when(m.validFrom), " → ", when(m.validTo, "open")),
    el("td", { class: "span" }, when(m.recordedAt), m.expiredAt ? el("span", { class: "expired" }, when(m.expiredAt))
      : null),
    el("td", null, historyList(m.history)));
}

async function loadFacts() {
  const data = await api(nsPath("/memories?history=1"));
  const known = new Map(data.memories.map(m => [m.id, m]));
  const out = [];
  for (const m of data.memories) {
    out.push(factRow(m, false));
    // Follow what it superseded: each older fact was in force just before its successor's validFrom.
    let cur = m;
    for (let hop = 0; cur.supersedes && hop < 50; hop++) {
      let old = known.get(cur.supersedes);
      if (!old) {
        const then = await api(nsPath("/memories?history=1&asOf=" + encodeURIComponent(justBefore(cur.validFrom))));
        for (const x of then.memories) if (!known.has(x.id)) known.set(x.id, x);
        old = known.get(cur.supersedes);
      }
      if (!old) {
        out.push(el("tr", { class: "superseded" }, el("td", { colspan: 4, class: "id" },
          `supersedes ${cur.supersedes} (not found in force before ${cur.validFrom}: forgotten?)`)));
        break;
      }
      out.push(factRow(old, true));
      cur = old;
    }
  }
  $("fact-count").textContent = `${data.memories.length} in force`;
  rows("facts", out, "no facts in force", 4);
}

async function runSearch(q, mode) {
  $("search-meta").hidden = false;
  $("search-meta").textContent = "searching…";
  const data = await api(nsPath("/search"), { q, mode, limit: 20 });
  const meta = $("search-meta");
  meta.replaceChildren();
  const served = data.served;
  if (served) {
    meta.append(el("span", { class: "served" }, "served: embed ", el("b", null, served.embed ?? "—"),
      " · rerank ", el("b", null, served.rerank ?? "—")));
  }
  const degraded = data.degraded || [];
  meta.append(el("span", { class: degraded.length ? "degraded bad" : "degraded" },
    "degraded: ", degraded.length ? degraded.join(", ") : "none"));
  if (data.timing) meta.append(el("span", null, `${data.timing.totalMs} ms`));
  meta.append(el("span", null, `${data.results.length} results · ${data.usedTokens} tokens`));
  $("results").hidden = false;
  rows("results", data.results.map(r => el("tr", { class: r.kind, "data-id": r.id },
    el("td", null, el("span", { class: "kind " + r.kind }, r.kind)),
    el("td", { class: "num score" }, Number(r.score).toFixed(4)),
    el("td", { class: "content" }, r.content),
    el("td", { class: "span" }, r.kind === "memory" ? el("span", null, when(r.validFrom), " → ", when(r.validTo, "open"))
      : el("span", { class: "id" }, r.documentId || "")))), "nothing found", 4);
}

// --- the flow ----------------------------------------------------------------------------------------

function needToken(msg) {
  sessionStorage.removeItem(KEY);
  token = null;
  $("data").hidden = true;
  $("ns-pick").hidden = $("logout").hidden = true;
  $("login").hidden = false;
  showError(msg || "");
  document.body.dataset.state = msg ? "error" : "login";
  $("token").focus();
}

async function openNamespace(name, q) {
  ns = name;
  sessionStorage.setItem(KEY + ".ns", name);
  document.body.dataset.state = "loading";
  showError("");
  $("results").hidden = $("search-meta").hidden = true;
  const jobs = [loadDocuments(), loadFacts()];
  if (q) jobs.push(runSearch(q, $("mode").value));
  await Promise.all(jobs);
  document.body.dataset.state = "ready";
}

async function start(frag) {
  token = sessionStorage.getItem(KEY);
  if (!token) { needToken(); return; }
  let list;
  try {
    list = (await api("/v5/namespaces")).namespaces;
  } catch (err) {
    if (err.status === 401) { needToken("token refused (" + err.message + ")"); return; }
    throw err;
  }
  $("login").hidden = true;
  $("logout").hidden = false;
  const pick = $("ns");
  pick.replaceChildren(...list.map(n => el("option", { value: n.name }, `${n.name} (${n.documents} docs, ` +
    `${n.memories} facts)`)));
  if (!list.length) throw new Error("this token has no namespaces");
  $("ns-pick").hidden = false;
  const want = frag.get("ns") || sessionStorage.getItem(KEY + ".ns");
  const chosen = list.find(n => n.name === want) ? want : list[0].name;
  if (want && want !== chosen) showError(`namespace ${want} is not among this token's; showing ${chosen}`);
  pick.value = chosen;
  if (frag.get("mode")) $("mode").value = frag.get("mode");
  if (frag.get("q")) $("q").value = frag.get("q");
  $("data").hidden = false;
  await openNamespace(chosen, frag.get("q"));
}

function fail(err) {
  document.body.dataset.state = "error";
  showError(String(err.message || err));
}

$("login").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("token").value.trim());
  $("token").value = "";
  start(new URLSearchParams()).catch(fail);
});
$("logout").addEventListener("click", () => needToken());
$("ns").addEventListener("change", ev => openNamespace(ev.target.value, null).catch(fail));
$("search").addEventListener("submit", ev => {
  ev.preventDefault();
  runSearch($("q").value, $("mode").value).catch(fail);
});

start(readFragment()).catch(fail);
