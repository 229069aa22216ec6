// cronhook console: fills the server-rendered page from /v1 with the key kept in this tab.
// No framework and no build step; the charts are uPlot's (vendor/uplot, served by cronhook).
"use strict";
const KEY = "cronhook-api-key";
const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];
const page = document.body.dataset.page;

function key() { return sessionStorage.getItem(KEY) || ""; }

class ApiError extends Error {
  constructor(status, problem, statusText) {
    const fields = problem && Array.isArray(problem.errors) ? problem.errors.map((e) => `${e.field}: ${e.message}`) : [];
    const detail = problem && problem.detail ? problem.detail : statusText;
    super(`${status} ${problem && problem.title ? problem.title : statusText}: ${detail}${fields.length ? ` (${fields.join("; ")})` : ""}`);
    this.status = status; this.problem = problem;
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${key()}`, ...(options.body ? { "Content-Type": "application/json" } : {}) };
  const response = await fetch(path, { ...options, headers });
  const body = response.status === 204 ? null : await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, body, response.statusText);
  return body;
}

// --- small DOM helpers ------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node[name] = value; else if (name === "className") node.className = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}
function showError(err) {
  const box = $("#error"); box.replaceChildren(); box.hidden = !err;
  if (!err) return;
  box.append(err instanceof Node ? err : String(err.message || err));
}
function notice(text) { const box = $("#notice"); box.textContent = text || ""; box.hidden = !text; }
const dash = "–";
function text(value) { return value === null || value === undefined || value === "" ? dash : String(value); }
function when(value) { return value ? new Date(value).toISOString().replace("T", " ").slice(0, 19) + "Z" : dash; }
// "3 min ago", "in 2 h": people read these before timestamps; the exact time is the tooltip.
function relative(value) {
  if (!value) return dash;
  const seconds = (new Date(value).getTime() - Date.now()) / 1000;
  const abs = Math.abs(seconds);
  const [n, unit] = abs < 45 ? [Math.round(abs), "s"] : abs < 2700 ? [Math.round(abs / 60), "min"]
    : abs < 129600 ? [Math.round(abs / 3600), "h"] : [Math.round(abs / 86400), "d"];
  if (abs < 1) return "now";
  return seconds < 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}
function timeEl(value) {
  if (!value) return dash;
  return el("time", { datetime: value, title: when(value) }, relative(value));
}
function cell(row, value, href) {
  const td = row.insertCell();
  if (value instanceof Node) td.append(value);
  else if (href) td.append(el("a", { href }, text(value)));
  else td.textContent = text(value);
  return td;
}
function button(label, onClick, className) { return el("button", { type: "button", className, onclick: onClick }, label); }
function shortId(id) { return id ? id.slice(0, 8) : dash; }
function fieldList(dl, fields) {
  dl.replaceChildren();
  for (const [name, value] of Object.entries(fields)) {
    const dd = el("dd", { "data-field": name });
    if (value instanceof Node) dd.append(value); else dd.textContent = text(value);
    dl.append(el("dt", {}, name), dd);
  }
}
// Destructive actions ask first, in the page's own dialog.
function ask(question) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = question;
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "ok");
    dialog.returnValue = "";
    dialog.showModal();
  });
}
async function act(fn) { try { showError(null); await fn(); } catch (err) { showError(err); } }
// An edit form: filled from the object's values; what a PATCH sends is only what changed (a
// field left empty, or in a hidden label, is not sent). JSON fields are parsed, naming the field.
function fillForm(form, names, values) {
  for (const name of names) form.elements[name].value = values[name] === null || values[name] === undefined ? "" : values[name];
}
function changedFields(form, names, values, jsonFields) {
  const body = {};
  for (const name of names) {
    const input = form.elements[name];
    if (input.closest("label").hidden || input.value === "" || input.value === String(values[name] ?? "")) continue;
    if (jsonFields.includes(name)) {
      try { body[name] = JSON.parse(input.value); } catch (err) { throw new Error(`${name}: not JSON (${err.message})`); }
    } else body[name] = input.type === "number" ? Number(input.value) : input.value;
  }
  return body;
}
// Submitting an edit form PATCHes `path` with what changed, closes the form and says so.
function patchOnSubmit(form, names, values, jsonFields, path, saved, reload) {
  form.onsubmit = (e) => {
    e.preventDefault();
    act(async () => {
      const body = changedFields(form, names, values, jsonFields);
      if (!Object.keys(body).length) { notice("nothing changed"); return; }
      await api(path, { method: "PATCH", body: JSON.stringify(body) });
      form.hidden = true; notice(`${saved}: ${Object.keys(body).join(", ")}`); await reload();
    });
  };
}

// Target names, one request per page load: names before UUIDs.
let targetCache = null;
async function targetsById() {
  if (!targetCache) {
    targetCache = new Map();
    for (let cursor = null, first = true; first || cursor; first = false) {
      const q = new URLSearchParams({ limit: "200", ...(cursor ? { cursor } : {}) });
      const pageOf = await api(`/v1/targets?${q}`);
      for (const t of pageOf.items) targetCache.set(t.id, t);
      cursor = pageOf.next_cursor;
    }
  }
  return targetCache;
}
function targetLink(targets, id) {
  const t = targets.get(id);
  return el("a", { href: `/ui/jobs?target=${id}`, title: id }, t ? t.name : shortId(id));
}

// The outcome of an open async attempt (the last of a job's runs), shown as a badge.
const AWAITING = "awaiting_completion";
// A finished async run's result is cut to this many characters; its cell's tooltip holds it all.
const RESULT_CHARS = 120;
function badge(label, kind = "awaiting") { return el("span", { className: `badge ${kind}` }, label); }
// A job's health (README: Schedule health) as a badge: healthy, late, failing, paused, unknown.
function healthBadge(health) { return badge(health, `health ${health}`); }
function completion(item, inherited) {
  const mode = item.completion || inherited;
  if (mode === "sync") return mode;
  const details = [];
  if (item.async_timeout_s) details.push(`timeout ${item.async_timeout_s}s`);
  if (item.heartbeat_timeout_s) details.push(`heartbeat ${item.heartbeat_timeout_s}s`);
  if (item.async_counts_in_flight === false) details.push("not counted in max in flight");
  return details.length ? `${mode} (${details.join(", ")})` : mode;
}
function progressText(item) {
  return [item.progress === null || item.progress === undefined ? null : `${item.progress}%`,
    item.progress_message ? `“${item.progress_message}”` : null].filter(Boolean).join(" ");
}
// A run's Result cell: an open attempt's progress; a finished async attempt's reported result.
function runResult(row, run) {
  const td = cell(row, null); td.className = "result";
  if (run.outcome === AWAITING) { td.textContent = `${progressText(run) || "no progress yet"} · deadline ${when(run.deadline_at)}`; return; }
  const parts = [];
  if (run.result !== null && run.result !== undefined) {
    const json = JSON.stringify(run.result);
    parts.push(json.length > RESULT_CHARS ? `${json.slice(0, RESULT_CHARS - 1)}…` : json);
    td.title = JSON.stringify(run.result, null, 2);
  }
  if (run.fenced_at) parts.push(`late report refused ${when(run.fenced_at)}`);
  td.textContent = parts.length ? parts.join(" · ") : dash;
}
function schedule(job) {
  const jitter = job.jitter_s ? `, jitter ${job.jitter_s}s` : "";
  if (job.cron) {
    const resolved = job.resolved_cron && job.resolved_cron !== job.cron ? ` = ${job.resolved_cron}` : "";
    return `cron ${job.cron}${resolved} (${job.timezone})${jitter}`;
  }
  if (job.after) return `after ${job.after.job_id.slice(0, 8)} (on ${job.after.on})`;
  return job.every_s ? `every ${job.every_s}s${jitter}` : "once";
}
function jobLink(job) { return el("a", { href: `/ui/jobs/${job.id}`, title: job.id }, job.name || shortId(job.id)); }

// --- overview -----------------------------------------------------------------------------
let charts = [];
function drawChart(box, title, times, series, options = {}) {
  box.replaceChildren();
  const width = Math.max(260, box.clientWidth || 600);
  const opts = {
    title: undefined, width, height: 220, legend: { show: true },
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max) * 1.1] } },
    axes: [{}, { size: 48 }],
    // `data` is ours, not uPlot's (its `values` is the legend's formatter).
    series: [{}, ...series.map(({ data, ...s }) => s)],
    ...options,
  };
  const chart = new uPlot(opts, [times, ...series.map((s) => s.data)], box);
  box.dataset.points = String(times.length);
  charts.push(chart);
  return chart;
}

async function overviewPage() {
  const window_ = new URLSearchParams(location.search).get("window") === "24h" ? "24h" : "1h";
  for (const a of $$("[data-window]")) a.classList.toggle("active", a.dataset.window === window_);
  const [stats, failing, targets] = await Promise.all([
    api(`/v1/stats/deliveries?window=${window_}`),
    api("/v1/jobs?health=failing&limit=10"),
    targetsById(),
  ]);
  const totals = stats.totals;
  const attempts = totals.delivered + totals.failed;
  const shown = { ...totals, failure_rate: attempts ? `${((100 * totals.failed) / attempts).toFixed(1)}%` : dash };
  for (const span of $$("[data-total]")) {
    const value = shown[span.dataset.total];
    span.textContent = span.dataset.total.startsWith("lateness") ? (value === null ? dash : `${value} ms`) : text(value);
  }
  // Every minute of the window, those without attempts as zeros (lateness: a gap).
  const byMinute = new Map(stats.buckets.map((b) => [Math.floor(new Date(b.at).getTime() / 1000), b]));
  const end = Math.floor(new Date(stats.now).getTime() / 1000 / stats.bucket_s) * stats.bucket_s;
  const count = window_ === "24h" ? 1440 : 60;
  const times = []; const delivered = []; const failed = []; const p50 = []; const p99 = [];
  for (let t = end - (count - 1) * stats.bucket_s; t <= end; t += stats.bucket_s) {
    const b = byMinute.get(t);
    times.push(t); delivered.push(b ? b.delivered : 0); failed.push(b ? b.failed : 0);
    p50.push(b ? b.lateness_p50_ms : null); p99.push(b ? b.lateness_p99_ms : null);
  }
  for (const chart of charts) chart.destroy();
  charts = [];
  const bars = uPlot.paths.bars({ size: [0.7, 40] });
  const deliveries = $("#chart-deliveries");
  drawChart(deliveries, "Attempts", times, [
    { label: "delivered", stroke: "#137333", fill: "rgba(19,115,51,.35)", data: delivered, paths: bars },
    { label: "failed", stroke: "#b3261e", fill: "rgba(179,38,30,.55)", data: failed, paths: bars },
  ]);
  deliveries.dataset.delivered = String(delivered.reduce((a, b) => a + b, 0));
  deliveries.dataset.failed = String(failed.reduce((a, b) => a + b, 0));
  drawChart($("#chart-lateness"), "Lateness", times, [
    { label: "p50 ms", stroke: "#1f5fbf", data: p50, points: { show: true, size: 5 } },
    { label: "p99 ms", stroke: "#8a5a00", data: p99, points: { show: true, size: 5 } },
  ]);
  const tbody = $("#busiest tbody"); tbody.replaceChildren();
  for (const t of stats.busiest_targets) {
    const row = tbody.insertRow();
    cell(row, el("a", { href: `/ui/jobs?target=${t.target_id}`, title: t.target_id }, t.name || shortId(t.target_id)));
    cell(row, t.attempts); cell(row, t.failed);
  }
  if (!stats.busiest_targets.length) cell(tbody.insertRow(), "no attempts in this window").colSpan = 3;
  const list = $("#failing"); list.replaceChildren();
  for (const job of failing.items) {
    list.append(el("li", {}, jobLink(job), " ", healthBadge(job.health), " · ", targetLink(targets, job.target_id),
      " · ", `${job.consecutive_failures} failure${job.consecutive_failures === 1 ? "" : "s"} in a row`, job.last_failure_at ? " · last " : null,
      job.last_failure_at ? timeEl(job.last_failure_at) : null));
  }
  if (!failing.items.length) list.append(el("li", { className: "hint" }, "none: every schedule is healthy, paused or new"));
}
window.addEventListener("resize", () => {
  for (const chart of charts) chart.setSize({ width: Math.max(260, chart.root.parentNode.clientWidth), height: 220 });
});

// --- jobs -----------------------------------------------------------------------------------
const FILTERS = ["q", "state", "health", "target"];
async function jobsPage() {
  const form = $("#filters");
  const params = new URLSearchParams(location.search);
  const targets = await targetsById();
  const select = form.elements.target;
  if (select.options.length === 1) {
    for (const t of [...targets.values()].sort((a, b) => a.name.localeCompare(b.name))) select.append(el("option", { value: t.id }, t.name));
  }
  for (const name of FILTERS) form.elements[name].value = params.get(name) || "";
  let cursor = null;
  let rows = [];
  let sortBy = null;
  const tbody = $("#jobs tbody");
  function draw() {
    tbody.replaceChildren();
    for (const job of rows) {
      const row = tbody.insertRow(); row.dataset.id = job.id;
      const name = cell(row, jobLink(job));
      if (job.name) name.append(el("span", { className: "sub mono" }, shortId(job.id)));
      cell(row, targetLink(targets, job.target_id));
      const state = cell(row, job.state); state.className = `state ${job.state}`;
      if (job.awaiting_completion) state.append(" ", badge("awaiting completion"));
      cell(row, healthBadge(job.health));
      cell(row, schedule(job)); cell(row, timeEl(job.next_run_at));
      cell(row, job.last_status_code); cell(row, timeEl(job.created_at));
    }
  }
  const sortValue = {
    name: (j) => (j.name || j.id).toLowerCase(), target: (j) => (targets.get(j.target_id) || {}).name || "",
    state: (j) => j.state, health: (j) => j.health, schedule: (j) => schedule(j),
    next_run_at: (j) => j.next_run_at || "9999", last_status_code: (j) => j.last_status_code || 0, created_at: (j) => j.created_at,
  };
  function sort() {
    if (!sortBy) return;
    const [field, dir] = sortBy;
    rows.sort((a, b) => { const x = sortValue[field](a); const y = sortValue[field](b); return (x < y ? -1 : x > y ? 1 : 0) * dir; });
  }
  // One page per state, asked at once rather than one after another.
  async function counts() {
    await Promise.all($$("[data-count]").map(async (td) => {
      const q = td.dataset.count ? `state=${td.dataset.count}&` : "";
      const pageOf = await api(`/v1/jobs?${q}limit=200`);
      td.textContent = pageOf.items.length + (pageOf.next_cursor ? "+" : "");
    }));
  }
  async function load(more) {
    const current = new URLSearchParams(location.search);
    if (!more) { rows = []; cursor = null; }
    const q = new URLSearchParams({ limit: "50" });
    for (const [name, param] of [["q", "q"], ["state", "state"], ["health", "health"], ["target", "target_id"]]) {
      if (current.get(name)) q.set(param, current.get(name));
    }
    if (cursor) q.set("cursor", cursor);
    const pageOf = await api(`/v1/jobs?${q}`);
    rows.push(...pageOf.items); sort(); draw();
    cursor = pageOf.next_cursor; $("#jobs-more").hidden = !cursor;
    const said = [current.get("state"), current.get("health"), current.get("target") ? `to ${(targets.get(current.get("target")) || {}).name || shortId(current.get("target"))}` : null,
      current.get("q") ? `matching “${current.get("q")}”` : null].filter(Boolean);
    $("#jobs-heading").textContent = said.length ? `Jobs: ${said.join(" · ")}` : "All jobs";
  }
  function go(params_) {
    history.pushState(null, "", `/ui/jobs${params_.toString() ? `?${params_}` : ""}`);
    for (const name of FILTERS) form.elements[name].value = params_.get(name) || "";
    return load(false).catch(showError);
  }
  form.onsubmit = (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    for (const name of FILTERS) if (form.elements[name].value) next.set(name, form.elements[name].value);
    go(next);
  };
  for (const a of $$("[data-state]")) {
    a.onclick = (e) => {
      e.preventDefault();
      const next = new URLSearchParams(location.search);
      if (a.dataset.state) next.set("state", a.dataset.state); else next.delete("state");
      go(next);
    };
  }
  for (const th of $$("#jobs th[data-sort]")) {
    th.onclick = () => {
      const dir = sortBy && sortBy[0] === th.dataset.sort ? -sortBy[1] : 1;
      sortBy = [th.dataset.sort, dir];
      for (const other of $$("#jobs th[data-sort]")) other.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      sort(); draw();
    };
  }
  window.onpopstate = () => jobsPage().catch(showError);
  $("#jobs-more").onclick = () => load(true).catch(showError);
  await counts(); await load(false);
}

// --- a job ----------------------------------------------------------------------------------
// A job's place in chains: the jobs it runs after (up to the first), and those that run after it.
async function showChain(job) {
  const parents = [];
  for (let link = job.after; link && parents.length < 10; ) {
    const parent = await api(`/v1/jobs/${link.job_id}`);
    parents.push([parent, link.on]);
    link = parent.after;
  }
  const children = (await api(`/v1/jobs?${new URLSearchParams({ after_job_id: job.id, limit: "50" })}`)).items;
  $("#chain").hidden = !parents.length && !children.length;
  const up = $("#chain-parents"); up.replaceChildren();
  parents.forEach(([parent, on], i) => {
    if (i) up.append(" ← ");
    up.append(jobLink(parent), ` (on ${on})`);
  });
  if (!parents.length) up.textContent = dash;
  const down = $("#chain-children"); down.replaceChildren();
  for (const child of children) down.append(el("li", {}, jobLink(child), ` on ${child.after.on} · ${child.state}`));
}

// An open attempt's page reloads itself while its receiver reports progress.
const OPEN_ATTEMPT_REFRESH_MS = 5000;
let refreshTimer = null;

function showOpenAttempt(job) {
  $("#open-attempt").hidden = !job.awaiting_completion;
  if (!job.awaiting_completion) return;
  const bar = $("#attempt-progress");
  if (job.progress === null) bar.removeAttribute("value"); else bar.value = job.progress;  // none yet: indeterminate
  $("#attempt-percent").textContent = job.progress === null ? "no progress reported yet" : `${job.progress}%`;
  $("#attempt-message").textContent = job.progress_message || "";
  fieldList($("#attempt-fields"), { deadline: when(job.deadline_at), "heartbeat deadline": when(job.heartbeat_deadline_at),
    "last heartbeat": when(job.last_heartbeat_at), attempt: `${job.attempt} of ${job.max_attempts}` });
}

function expectText(expect) {
  const parts = [];
  if (expect.success_within_s) parts.push(`a success within ${expect.success_within_s}s`);
  if (expect.max_consecutive_failures) parts.push(`at most ${expect.max_consecutive_failures} failures in a row`);
  return parts.join(", ");
}

function runDetail(run) {
  const late = run.attempt === 1 && run.started_at
    ? `${Math.max(0, new Date(run.started_at) - new Date(run.fire_at || run.scheduled_for))} ms` : null;
  const dl = el("dl");
  fieldList(dl, { run: run.id || "open", "scheduled for": when(run.scheduled_for), "fired at": run.fire_at ? when(run.fire_at) : null,
    started: when(run.started_at), finished: when(run.finished_at), lateness: late, outcome: run.outcome, status: run.status_code,
    duration: run.duration_ms === null || run.duration_ms === undefined ? null : `${run.duration_ms} ms`,
    error: run.error ? el("pre", {}, run.error) : null,
    result: run.result === null || run.result === undefined ? null : el("pre", {}, JSON.stringify(run.result, null, 2)),
    reported: run.reported_at ? when(run.reported_at) : null, "late report refused": run.fenced_at ? when(run.fenced_at) : null });
  return dl;
}

let jobCursor = null;
async function jobRuns(id, more) {
  const tbody = $("#runs tbody");
  if (!more) { tbody.replaceChildren(); jobCursor = null; }
  const q = new URLSearchParams({ limit: "50", order: "desc", ...(jobCursor ? { cursor: jobCursor } : {}) });
  const pageOf = await api(`/v1/jobs/${id}/runs?${q}`);
  for (const run of pageOf.items) {
    const row = tbody.insertRow(); row.className = "run"; row.tabIndex = 0;
    cell(row, timeEl(run.scheduled_for)); cell(row, run.cause_id ? shortId(run.cause_id) : null); cell(row, run.attempt);
    const outcome = cell(row, run.outcome === AWAITING ? "" : run.outcome); outcome.className = `outcome ${run.outcome}`;
    if (run.outcome === AWAITING) outcome.append(badge("awaiting completion"));
    cell(row, run.status_code); cell(row, run.duration_ms === null ? null : `${run.duration_ms} ms`);
    cell(row, timeEl(run.finished_at)); cell(row, run.error); runResult(row, run);
    row.onclick = () => {
      const open = row.nextElementSibling && row.nextElementSibling.classList.contains("detail");
      if (open) { row.nextElementSibling.remove(); return; }
      const detail = el("tr", { className: "detail" }); const td = el("td", { colspan: "9" }, runDetail(run));
      detail.append(td); row.after(detail);
    };
  }
  jobCursor = pageOf.next_cursor; $("#runs-more").hidden = !jobCursor;
}

const EDITABLE = ["name", "cron", "timezone", "every_s", "priority", "max_attempts", "payload"];
function openEdit(job) {
  const form = $("#job-edit");
  for (const label of $$("[data-for]", form)) label.hidden = label.dataset.for === "cron" ? !job.cron : !job.every_s;
  const values = { ...job, payload: JSON.stringify(job.payload, null, 2) };
  fillForm(form, EDITABLE, values);
  form.hidden = false;
  patchOnSubmit(form, EDITABLE, values, ["payload"], `/v1/jobs/${job.id}`, "saved", jobPage);
}

async function jobPage() {
  const id = document.body.dataset.jobId;
  const [job, targets] = await Promise.all([api(`/v1/jobs/${id}`), targetsById()]);
  clearTimeout(refreshTimer);
  if (job.awaiting_completion) refreshTimer = setTimeout(() => jobPage().catch(showError), OPEN_ATTEMPT_REFRESH_MS);
  showOpenAttempt(job);
  $("h1").replaceChildren(`Job ${job.name || job.id} `, healthBadge(job.health));
  const labels = Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
  fieldList($("#job-fields"), { id: job.id, key: job.key, set: job.set, labels: labels || null, state: job.state, schedule: schedule(job),
    completion: completion(job, "the target's"),
    target: targetLink(targets, job.target_id), parent: job.parent_job_id ? el("a", { href: `/ui/jobs/${job.parent_job_id}` }, shortId(job.parent_job_id)) : null,
    priority: job.priority,
    "next run": job.next_run_at ? el("span", {}, timeEl(job.next_run_at), ` (${when(job.next_run_at)})`) : null,
    attempt: `${job.attempt} of ${job.max_attempts}`, runs: job.runs,
    "last status": job.last_status_code, "last error": job.last_error, health: job.health,
    "last success": job.last_success_at ? timeEl(job.last_success_at) : null, "last failure": job.last_failure_at ? timeEl(job.last_failure_at) : null,
    "failures in a row": job.consecutive_failures, expect: job.expect ? expectText(job.expect) : "the tenant's defaults",
    created: timeEl(job.created_at), payload: el("pre", {}, JSON.stringify(job.payload, null, 2)) });
  await showChain(job);
  const fires = $("#next-fires"); fires.replaceChildren();
  let times = [];
  if (job.cron && ["scheduled", "retrying", "running", "paused"].includes(job.state)) {
    // The resolved expression: hashed values (H) as this job has them.
    const q = new URLSearchParams({ cron: job.resolved_cron || job.cron, timezone: job.timezone || "UTC", count: "5" });
    times = (await api(`/v1/schedules/preview?${q}`)).fire_times.map((f) => `${f.at} (${relative(f.utc)})`);
  } else if (job.every_s && job.next_run_at) {
    const first = new Date(job.next_run_at).getTime();
    times = [0, 1, 2, 3, 4].map((i) => when(new Date(first + i * job.every_s * 1000).toISOString()));
  } else if (job.next_run_at) times = [when(job.next_run_at)];
  for (const t of times.length ? times : ["none"]) fires.append(el("li", {}, t));
  await jobRuns(id, false);
  $("#runs-more").onclick = () => jobRuns(id, true).catch(showError);
  $("#edit-toggle").onclick = () => openEdit(job);
  $("#edit-cancel").onclick = () => { $("#job-edit").hidden = true; };
  const finished = ["succeeded", "dead", "cancelled"].includes(job.state);
  for (const b of $$("[data-action]")) {
    b.disabled = finished && b.dataset.action !== "trigger";
    b.onclick = () => act(async () => {
      if (b.dataset.action === "cancel" &&
        !(await ask(`Cancel ${job.name || job.id}? Its waiting occurrence is dropped and it will not run again.`))) return;
      const result = await api(`/v1/jobs/${id}/${b.dataset.action}`, { method: "POST" });
      if (b.dataset.action === "trigger") location.href = `/ui/jobs/${result.id}`;
      else { notice(`${b.dataset.action}: done`); await jobPage(); }
    });
  }
}

// --- dead letters ---------------------------------------------------------------------------
async function deadLettersPage() {
  const targets = await targetsById();
  const tbody = $("#dead-letters tbody"); tbody.replaceChildren();
  for (const dl of (await api("/v1/dead-letters?limit=200")).items) {
    const row = tbody.insertRow(); row.dataset.id = dl.id;
    row.insertCell().append(el("input", { type: "checkbox", className: "pick", "aria-label": "select" }));
    cell(row, el("a", { href: `/ui/jobs/${dl.job_id}`, title: dl.job_id }, dl.job_name || shortId(dl.job_id)));
    cell(row, targetLink(targets, dl.target_id));
    cell(row, timeEl(dl.scheduled_for)); cell(row, dl.attempts);
    cell(row, dl.last_status_code); cell(row, dl.last_error); cell(row, timeEl(dl.created_at));
    cell(row, dl.replay_job_id ? "yes" : "no", dl.replay_job_id ? `/ui/jobs/${dl.replay_job_id}` : null).className = "replayed";
    const actions = row.insertCell(); actions.className = "row-actions";
    actions.append(
      button("Replay", () => act(async () => {
        const job = await api(`/v1/dead-letters/${dl.id}/replay`, { method: "POST" });
        $("#replay-result").textContent = `replayed as ${job.id}`; await deadLettersPage();
      })),
      " ", button("View / edit", () => act(() => openDeadLetter(dl, targets))),
      " ", button("Delete", () => act(async () => {
        if (!(await ask(`Delete the dead letter of ${dl.job_name || dl.job_id}? Its payload is gone for good.`))) return;
        await api(`/v1/dead-letters/${dl.id}`, { method: "DELETE" });
        notice("deleted"); await deadLettersPage();
      }), "danger"),
    );
  }
  $("#select-all").onchange = (e) => { for (const b of $$(".pick")) b.checked = e.target.checked; };
  $("#replay-selected").onclick = () => act(async () => {
    const ids = $$(".pick:checked").map((b) => b.closest("tr").dataset.id);
    if (!ids.length) { notice("select dead letters first"); return; }
    if (!(await ask(`Replay ${ids.length} dead letter(s) now?`))) return;
    for (const one of ids) await api(`/v1/dead-letters/${one}/replay`, { method: "POST" });
    $("#replay-result").textContent = `${ids.length} replayed`; await deadLettersPage();
  });
  $("#replay-all").onclick = () => act(async () => {
    if (!(await ask("Replay every dead letter not yet replayed (up to 1,000, 10 a second)?"))) return;
    const result = await api("/v1/dead-letters/replay", { method: "POST", body: JSON.stringify({ limit: 1000 }) });
    $("#replay-result").textContent = `${result.replayed.length} replayed`; await deadLettersPage();
  });
}

async function openDeadLetter(dl, targets) {
  const detail = await api(`/v1/dead-letters/${dl.id}`);
  const form = $("#dead-letter-view");
  $("#dead-letter-job").replaceChildren(el("a", { href: `/ui/jobs/${dl.job_id}` }, detail.job_name || shortId(dl.job_id)));
  const payload = JSON.stringify(detail.payload, null, 2);
  form.elements.payload.value = payload;
  const select = form.elements.target_id; select.replaceChildren();
  for (const t of targets.values()) select.append(el("option", { value: t.id, selected: t.id === detail.target_id }, t.name));
  // Its target deleted since: kept as the choice, so a replay goes nowhere else unasked (the API says why).
  if (!targets.has(detail.target_id)) {
    select.prepend(el("option", { value: detail.target_id, selected: true }, `${shortId(detail.target_id)} (deleted)`));
  }
  const runs = $("#dead-letter-runs"); runs.replaceChildren();
  for (const run of detail.runs) {
    runs.append(el("li", {}, `${when(run.finished_at)} · ${run.outcome}${run.status_code ? ` ${run.status_code}` : ""}`,
      run.error ? ` · ${run.error}` : ""));
  }
  form.hidden = false; form.scrollIntoView();
  $("#dead-letter-close").onclick = () => { form.hidden = true; };
  form.onsubmit = (e) => {
    e.preventDefault();
    act(async () => {
      const body = {};
      if (form.elements.payload.value !== payload) {
        try { body.payload = JSON.parse(form.elements.payload.value); } catch (err) { throw new Error(`payload: not JSON (${err.message})`); }
      }
      if (select.value !== detail.target_id) body.target_id = select.value;
      const job = await api(`/v1/dead-letters/${dl.id}/replay`, { method: "POST", body: JSON.stringify(body) });
      form.hidden = true;
      $("#replay-result").replaceChildren(`replayed as `, el("a", { href: `/ui/jobs/${job.id}` }, job.id),
        Object.keys(body).length ? ` with a new ${Object.keys(body).join(" and ")}` : "");
      await deadLettersPage();
    });
  };
}

// --- targets --------------------------------------------------------------------------------
const TARGET_FIELDS = ["name", "url", "timeout_s", "max_in_flight", "rate_per_s", "headers"];
async function targetsPage() {
  targetCache = null;
  const targets = await targetsById();
  const tbody = $("#targets tbody"); tbody.replaceChildren();
  for (const t of targets.values()) {
    const row = tbody.insertRow(); row.dataset.id = t.id;
    cell(row, t.name, `/ui/jobs?target=${t.id}`); cell(row, t.url); cell(row, `${t.timeout_s}s`); cell(row, t.max_in_flight); cell(row, t.rate_per_s);
    cell(row, completion(t, "sync")).className = "completion";
    cell(row, Object.keys(t.headers).join(", "));
    cell(row, t.paused ? badge(`paused${t.paused_reason ? `: ${t.paused_reason}` : ""}`, "paused") : "active");
    cell(row, timeEl(t.created_at));
    row.insertCell().append(
      button("Edit", () => openTargetEdit(t)), " ",
      button("Rotate secret", () => openRotate(t)), " ",
      button("Delete", () => act(async () => {
        if (!(await ask(`Delete target ${t.name}? Jobs can no longer be sent to it.`))) return;
        await api(`/v1/targets/${t.id}`, { method: "DELETE" });
        notice(`deleted ${t.name}`); await targetsPage();
      }), "danger"));
  }
}
function openTargetEdit(t) {
  const form = $("#target-edit"); $("#target-rotate").hidden = true;
  $("#target-edit-name").textContent = t.name;
  const values = { ...t, headers: "" };
  fillForm(form, TARGET_FIELDS, values);
  form.hidden = false; form.scrollIntoView();
  $("#target-edit-cancel").onclick = () => { form.hidden = true; };
  patchOnSubmit(form, TARGET_FIELDS, values, ["headers"], `/v1/targets/${t.id}`, `saved ${t.name}`, targetsPage);
}
function openRotate(t) {
  const form = $("#target-rotate"); $("#target-edit").hidden = true;
  $("#target-rotate-name").textContent = t.name; $("#target-secret").hidden = true;
  form.hidden = false; form.scrollIntoView();
  $("#target-rotate-cancel").onclick = () => { form.hidden = true; $("#target-secret").textContent = ""; };
  form.onsubmit = (e) => {
    e.preventDefault();
    act(async () => {
      const grace = Number(form.elements.grace_s.value || 0);
      if (!(await ask(`Rotate ${t.name}'s signing secret? The old one signs too for ${grace} s, then stops.`))) return;
      const secret = await api(`/v1/targets/${t.id}/rotate-secret`, { method: "POST", body: JSON.stringify({ grace_s: grace }) });
      const box = $("#target-secret");
      box.textContent = `New secret (shown once; give it to the receiver): ${secret.secret}`; box.hidden = false;
    });
  };
}

// --- admin ----------------------------------------------------------------------------------
async function clusterPage() {
  const [view, keys] = await Promise.all([api("/v1/cluster"), api("/v1/admin/api-keys")]);
  fieldList($("#cluster-summary"), { "database clock": when(view.now), partitions: view.partition_count,
    replicas: view.replicas.length, unowned: view.unowned_partitions.length });
  const tbody = $("#replicas tbody"); tbody.replaceChildren();
  for (const r of view.replicas) {
    const row = tbody.insertRow();
    cell(row, r.id); cell(row, r.partition_count); cell(row, timeEl(r.oldest_due_at)); cell(row, r.lag_s.toFixed(1));
    cell(row, timeEl(r.heartbeat_at)); cell(row, timeEl(r.started_at));
  }
  const keyRows = $("#api-keys tbody"); keyRows.replaceChildren();
  for (const k of keys) {
    const row = keyRows.insertRow(); row.dataset.id = k.id;
    cell(row, k.name); cell(row, k.key_prefix).className = "mono"; cell(row, k.tenant); cell(row, k.kind);
    cell(row, timeEl(k.created_at)); cell(row, k.revoked_at ? timeEl(k.revoked_at) : "no");
    const actions = row.insertCell();
    if (!k.revoked_at) {
      actions.append(button("Revoke", () => act(async () => {
        if (!(await ask(`Revoke key ${k.name || k.key_prefix} of ${k.tenant}? Every request with it is refused at once.`))) return;
        await api(`/v1/admin/api-keys/${k.id}/revoke`, { method: "POST" });
        notice(`revoked ${k.key_prefix}`); await clusterPage();
      }), "danger"));
    }
  }
}

// --- the page -------------------------------------------------------------------------------
const PAGES = { overview: overviewPage, jobs: jobsPage, job: jobPage, "dead-letters": deadLettersPage, targets: targetsPage, cluster: clusterPage };
const LIVE_KEY = `cronhook-live-${page}`;
const REFRESH_MS = 10_000;
let liveTimer = null;

// A 401 on a tenant's page with the admin key: say so, and where that key works.
async function explain(err) {
  if (err instanceof ApiError && err.status === 401 && page !== "cluster") {
    const isAdmin = await fetch("/v1/cluster", { headers: { Authorization: `Bearer ${key()}` } }).then((r) => r.ok, () => false);
    if (isAdmin) {
      return el("span", { id: "admin-key" }, "This is the admin key: it manages the cluster and API keys, not a tenant's jobs. Open ",
        el("a", { href: "/ui/cluster" }, "Admin"), ", or use a tenant's key here.");
    }
  }
  return err;
}

async function refresh() {
  try {
    await PAGES[page]();
    document.body.classList.add("loaded");
    $("#refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) { showError(await explain(err)); }
}

function render() {
  $("#key-state").textContent = key() ? "key set" : "no key";
  if (!key()) { showError(new Error("Enter an API key above.")); return; }
  showError(null); targetCache = null;
  refresh();
}

const live = $("#live");
live.checked = (sessionStorage.getItem(LIVE_KEY) ?? (page === "overview" ? "1" : "")) === "1";
function schedule_live() {
  clearInterval(liveTimer);
  if (live.checked) liveTimer = setInterval(() => { if (key() && !document.hidden) { targetCache = null; refresh(); } }, REFRESH_MS);
}
live.onchange = () => { sessionStorage.setItem(LIVE_KEY, live.checked ? "1" : ""); schedule_live(); };
schedule_live();

$("#key-form").onsubmit = (e) => {
  e.preventDefault(); const value = $("#key-input").value.trim();
  if (value) sessionStorage.setItem(KEY, value);
  $("#key-input").value = ""; render();
};
$("#key-forget").onclick = () => { sessionStorage.removeItem(KEY); render(); };
render();
