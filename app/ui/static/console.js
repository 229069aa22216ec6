// cronhook console: fills the server-rendered page from /v1 with the key kept in this tab.
"use strict";
const KEY = "cronhook-api-key";
const $ = (sel) => document.querySelector(sel);
const page = document.body.dataset.page;

function key() { return sessionStorage.getItem(KEY) || ""; }

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${key()}`, ...(options.body ? { "Content-Type": "application/json" } : {}) };
  const response = await fetch(path, { ...options, headers });
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) throw new Error(`${response.status}: ${body && body.detail ? body.detail : response.statusText}`);
  return body;
}

function showError(err) { const box = $("#error"); box.textContent = err ? String(err.message || err) : ""; box.hidden = !err; }
function when(value) { return value ? new Date(value).toISOString().replace("T", " ").slice(0, 19) + "Z" : "–"; }
function cell(row, value, href) {
  const td = row.insertCell();
  if (href) { const a = document.createElement("a"); a.href = href; a.textContent = value; td.append(a); }
  else td.textContent = value === null || value === undefined ? "–" : String(value);
  return td;
}
function button(label, onClick) { const b = document.createElement("button"); b.textContent = label; b.onclick = onClick; return b; }
// The outcome of an open async attempt (the last of a job's runs), shown as a badge.
const AWAITING = "awaiting_completion";
// A finished async run's result is cut to this many characters; its cell's tooltip holds it all.
const RESULT_CHARS = 120;
function badge(text) { const span = document.createElement("span"); span.className = "badge awaiting"; span.textContent = text; return span; }
// A job's health (README: Schedule health) as a badge: healthy, late, failing, paused, unknown.
function healthBadge(health) {
  const span = document.createElement("span"); span.className = `badge health ${health}`; span.textContent = health;
  return span;
}
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
    const text = JSON.stringify(run.result);
    parts.push(text.length > RESULT_CHARS ? `${text.slice(0, RESULT_CHARS - 1)}…` : text);
    td.title = JSON.stringify(run.result, null, 2);
  }
  if (run.fenced_at) parts.push(`late report refused ${when(run.fenced_at)}`);
  td.textContent = parts.length ? parts.join(" · ") : "–";
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

async function jobsPage() {
  let state = new URLSearchParams(location.search).get("state") || "";
  let cursor = null;
  const tbody = $("#jobs tbody");
  async function counts() {
    for (const td of document.querySelectorAll("[data-count]")) {
      const q = td.dataset.count ? `state=${td.dataset.count}&` : "";
      const pageOf = await api(`/v1/jobs?${q}limit=200`);
      td.textContent = pageOf.items.length + (pageOf.next_cursor ? "+" : "");
    }
  }
  async function load(more) {
    if (!more) { tbody.replaceChildren(); cursor = null; }
    const q = new URLSearchParams({ limit: "50" });
    if (state) q.set("state", state);
    if (cursor) q.set("cursor", cursor);
    const pageOf = await api(`/v1/jobs?${q}`);
    for (const job of pageOf.items) {
      const row = tbody.insertRow();
      cell(row, job.name || job.id, `/ui/jobs/${job.id}`);
      const state = cell(row, job.state); state.className = `state ${job.state}`;
      if (job.awaiting_completion) state.append(" ", badge("awaiting completion"));
      row.insertCell().append(healthBadge(job.health));
      cell(row, schedule(job)); cell(row, when(job.next_run_at)); cell(row, job.attempt);
      cell(row, job.last_status_code); cell(row, when(job.created_at));
    }
    cursor = pageOf.next_cursor; $("#jobs-more").hidden = !cursor;
    $("#jobs-heading").textContent = state ? `Jobs: ${state}` : "All jobs";
  }
  for (const a of document.querySelectorAll("[data-state]")) {
    a.onclick = (e) => { e.preventDefault(); state = a.dataset.state; load(false).catch(showError); };
  }
  $("#jobs-more").onclick = () => load(true).catch(showError);
  await counts(); await load(false);
}

function jobLink(job) {
  const a = document.createElement("a"); a.href = `/ui/jobs/${job.id}`; a.textContent = job.name || job.id;
  return a;
}

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
  if (!parents.length) up.textContent = "–";
  const down = $("#chain-children"); down.replaceChildren();
  for (const child of children) {
    const li = document.createElement("li"); li.append(jobLink(child), ` on ${child.after.on} · ${child.state}`);
    down.append(li);
  }
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
  const dl = $("#attempt-fields"); dl.replaceChildren();
  const fields = { deadline: when(job.deadline_at), "heartbeat deadline": when(job.heartbeat_deadline_at),
    "last heartbeat": when(job.last_heartbeat_at), attempt: `${job.attempt} of ${job.max_attempts}` };
  for (const [name, value] of Object.entries(fields)) {
    const dt = document.createElement("dt"); dt.textContent = name;
    const dd = document.createElement("dd"); dd.textContent = value; dd.dataset.field = name;
    dl.append(dt, dd);
  }
}

function expectText(expect) {
  const parts = [];
  if (expect.success_within_s) parts.push(`a success within ${expect.success_within_s}s`);
  if (expect.max_consecutive_failures) parts.push(`at most ${expect.max_consecutive_failures} failures in a row`);
  return parts.join(", ");
}
async function jobPage() {
  const id = document.body.dataset.jobId;
  const job = await api(`/v1/jobs/${id}`);
  clearTimeout(refreshTimer);
  if (job.awaiting_completion) refreshTimer = setTimeout(() => jobPage().catch(showError), OPEN_ATTEMPT_REFRESH_MS);
  showOpenAttempt(job);
  document.querySelector("h1").replaceChildren(`Job ${job.name || job.id} `, healthBadge(job.health));
  const dl = $("#job-fields"); dl.replaceChildren();
  const labels = Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
  const fields = { id: job.id, key: job.key, set: job.set, labels: labels || null, state: job.state, schedule: schedule(job),
    completion: completion(job, "the target's"),
    target: job.target_id, priority: job.priority,
    "next run": when(job.next_run_at), attempt: `${job.attempt} of ${job.max_attempts}`, runs: job.runs,
    "last status": job.last_status_code, "last error": job.last_error, health: job.health,
    "last success": when(job.last_success_at), "last failure": when(job.last_failure_at),
    "failures in a row": job.consecutive_failures, expect: job.expect ? expectText(job.expect) : "the tenant's defaults",
    payload: JSON.stringify(job.payload) };
  for (const [name, value] of Object.entries(fields)) {
    const dt = document.createElement("dt"); dt.textContent = name;
    const dd = document.createElement("dd"); dd.textContent = value === null || value === undefined ? "–" : String(value);
    dl.append(dt, dd);
  }
  await showChain(job);
  const fires = $("#next-fires"); fires.replaceChildren();
  let times = [];
  if (job.cron && ["scheduled", "retrying", "running", "paused"].includes(job.state)) {
    // The resolved expression: hashed values (H) as this job has them.
    const q = new URLSearchParams({ cron: job.resolved_cron || job.cron, timezone: job.timezone || "UTC", count: "5" });
    times = (await api(`/v1/schedules/preview?${q}`)).fire_times.map((f) => `${f.at} (${when(f.utc)})`);
  } else if (job.every_s && job.next_run_at) {
    const first = new Date(job.next_run_at).getTime();
    times = [0, 1, 2, 3, 4].map((i) => when(new Date(first + i * job.every_s * 1000).toISOString()));
  } else if (job.next_run_at) times = [when(job.next_run_at)];
  for (const t of times.length ? times : ["none"]) { const li = document.createElement("li"); li.textContent = t; fires.append(li); }
  const tbody = $("#runs tbody"); tbody.replaceChildren();
  for (const run of (await api(`/v1/jobs/${id}/runs?limit=100`)).items) {
    const row = tbody.insertRow();
    cell(row, when(run.scheduled_for)); cell(row, run.cause_id); cell(row, run.attempt);
    const outcome = cell(row, run.outcome === AWAITING ? "" : run.outcome); outcome.className = `outcome ${run.outcome}`;
    if (run.outcome === AWAITING) outcome.append(badge("awaiting completion"));
    cell(row, run.status_code); cell(row, run.duration_ms === null ? null : `${run.duration_ms} ms`);
    cell(row, when(run.finished_at)); cell(row, run.error); runResult(row, run);
  }
  for (const b of document.querySelectorAll("[data-action]")) {
    b.onclick = async () => {
      try {
        const result = await api(`/v1/jobs/${id}/${b.dataset.action}`, { method: "POST" });
        if (b.dataset.action === "trigger") location.href = `/ui/jobs/${result.id}`; else { showError(null); await jobPage(); }
      } catch (err) { showError(err); }
    };
  }
}

async function deadLettersPage() {
  const tbody = $("#dead-letters tbody"); tbody.replaceChildren();
  for (const dl of (await api("/v1/dead-letters?limit=200")).items) {
    const row = tbody.insertRow(); row.dataset.id = dl.id;
    const box = document.createElement("input"); box.type = "checkbox"; box.className = "pick"; box.setAttribute("aria-label", "select");
    row.insertCell().append(box);
    cell(row, dl.job_id.slice(0, 8), `/ui/jobs/${dl.job_id}`); cell(row, when(dl.scheduled_for)); cell(row, dl.attempts);
    cell(row, dl.last_status_code); cell(row, dl.last_error); cell(row, when(dl.created_at));
    cell(row, dl.replay_job_id ? "yes" : "no", dl.replay_job_id ? `/ui/jobs/${dl.replay_job_id}` : null);
    row.insertCell().append(button("Replay", async () => {
      try { const job = await api(`/v1/dead-letters/${dl.id}/replay`, { method: "POST" }); $("#replay-result").textContent = `replayed as ${job.id}`; await deadLettersPage(); }
      catch (err) { showError(err); }
    }));
  }
  $("#select-all").onchange = (e) => { for (const b of document.querySelectorAll(".pick")) b.checked = e.target.checked; };
  $("#replay-selected").onclick = async () => {
    try {
      const ids = [...document.querySelectorAll(".pick:checked")].map((b) => b.closest("tr").dataset.id);
      for (const one of ids) await api(`/v1/dead-letters/${one}/replay`, { method: "POST" });
      $("#replay-result").textContent = `${ids.length} replayed`; await deadLettersPage();
    } catch (err) { showError(err); }
  };
  $("#replay-all").onclick = async () => {
    try {
      const result = await api("/v1/dead-letters/replay", { method: "POST", body: JSON.stringify({ limit: 1000 }) });
      $("#replay-result").textContent = `${result.replayed.length} replayed`; await deadLettersPage();
    } catch (err) { showError(err); }
  };
}

async function targetsPage() {
  const tbody = $("#targets tbody"); tbody.replaceChildren();
  for (const t of (await api("/v1/targets?limit=200")).items) {
    const row = tbody.insertRow();
    cell(row, t.name); cell(row, t.url); cell(row, `${t.timeout_s}s`); cell(row, t.max_in_flight); cell(row, t.rate_per_s);
    cell(row, completion(t, "sync")).className = "completion";
    cell(row, Object.keys(t.headers).join(", ")); cell(row, when(t.created_at));
  }
}

async function clusterPage() {
  const view = await api("/v1/cluster");
  const dl = $("#cluster-summary"); dl.replaceChildren();
  for (const [name, value] of Object.entries({ "database clock": when(view.now), partitions: view.partition_count,
    replicas: view.replicas.length, unowned: view.unowned_partitions.length })) {
    const dt = document.createElement("dt"); dt.textContent = name; const dd = document.createElement("dd"); dd.textContent = value; dl.append(dt, dd);
  }
  const tbody = $("#replicas tbody"); tbody.replaceChildren();
  for (const r of view.replicas) {
    const row = tbody.insertRow();
    cell(row, r.id); cell(row, r.partition_count); cell(row, when(r.oldest_due_at)); cell(row, r.lag_s.toFixed(1));
    cell(row, when(r.heartbeat_at)); cell(row, when(r.started_at));
  }
}

const PAGES = { jobs: jobsPage, job: jobPage, "dead-letters": deadLettersPage, targets: targetsPage, cluster: clusterPage };

function render() {
  $("#key-state").textContent = key() ? "key set" : "no key";
  if (!key()) { showError(new Error("Enter an API key above.")); return; }
  showError(null);
  PAGES[page]().then(() => document.body.classList.add("loaded")).catch(showError);
}

$("#key-form").onsubmit = (e) => {
  e.preventDefault(); const value = $("#key-input").value.trim();
  if (value) sessionStorage.setItem(KEY, value);
  $("#key-input").value = ""; render();
};
$("#key-forget").onclick = () => { sessionStorage.removeItem(KEY); render(); };
render();
