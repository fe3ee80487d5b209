// The live view: who runs and who waits now, from GET /live once a second.
import { get } from "./api.js";
import { count, fill, h, seconds, table } from "./dom.js";

let timer = null;
let root = null;
let context = null;

export function show(el, ctx) {
  root = el;
  context = ctx;
  fill(root, h("h1", {}, "Live"), h("p", { class: "muted" }, "Reading GET /live…"));
  refresh();
  timer = setInterval(refresh, 1000);
}

export function hide() {
  clearInterval(timer);
  timer = null;
  root = null;
}

async function refresh() {
  const el = root;
  let live;
  try {
    live = await get("/live");
  } catch (e) {
    if (el === root && el) {
      const old = el.querySelector(".stale");
      const note = h("p", { class: "error stale", role: "alert" }, `The view is not current: ${e.message}`);
      if (old) old.replaceWith(note);
      else el.prepend(note);
    }
    return;
  }
  if (el !== root || !el) return;
  fill(el, render(live));
}

function render(live) {
  const s = live.slots;
  const q = live.queue;
  const r = live.rates || {};
  const up = live.upstream || {};
  const cards = h(
    "div",
    { class: "cards" },
    card("upstream", up.ready ? "ready" : "NOT READY", up.last_error || up.target || ""),
    card("slots busy", `${s.busy} / ${s.total}`, s.kv_pool_tokens ? `KV ${count(s.kv_reserved_tokens)} / ${count(s.kv_pool_tokens)}` : ""),
    card("waiting", `${q.depth} / ${q.capacity}`, q.draining ? "draining" : `est. wait ${seconds(q.estimated_wait_seconds)}`),
    card("requests/s", count(r.requests_per_second), `${count(r.tokens_per_second)} tok/s generated`),
    card("refused/s", count(r.refused_per_second), `wait p50 ${seconds(r.queue_wait_p50_seconds)} · p95 ${seconds(r.queue_wait_p95_seconds)}`),
  );
  const inside = live.requests.filter((x) => x.phase !== "queued");
  const running = table(
    [
      { title: "request" },
      { title: "tenant" },
      { title: "endpoint" },
      { title: "phase" },
      { title: "priority", num: true },
      { title: "age", num: true },
      { title: "in service", num: true },
      { title: "prompt", num: true },
      { title: "generated", num: true },
    ],
    inside.map((x) => [
      x.request_id,
      x.tenant || "-",
      x.path,
      x.phase,
      String(x.priority),
      seconds(x.age_seconds),
      seconds(x.in_service_seconds),
      count(x.prompt_tokens),
      count(x.generated_tokens),
    ]),
    { id: "running", empty: "nothing runs" },
  );
  const waiting = table(
    [
      { title: "#", num: true },
      { title: "request" },
      { title: "tenant" },
      { title: "endpoint" },
      { title: "priority" },
      { title: "age", num: true },
      { title: "reserved", num: true },
      { title: "expected start", num: true },
      { title: "why it waits" },
    ],
    q.waiters.map((w, i) => [
      String(i + 1),
      w.request_id || "(left)",
      w.tenant,
      w.path || "-",
      w.effective_priority === w.priority ? String(w.priority) : `${w.priority} → ${w.effective_priority}`,
      seconds(w.age_seconds),
      count(w.reserved_tokens),
      `in ${seconds(w.expected_start_seconds)}` + (w.deadline_in_seconds == null ? "" : ` (deadline in ${seconds(w.deadline_in_seconds)})`),
      reason(w, i, live),
    ]),
    { id: "waiting", empty: "nobody waits" },
  );
  const tenants = table(
    [
      { title: "tenant" },
      { title: "in service", num: true },
      { title: "waiting", num: true },
      { title: "requests", num: true },
      { title: "tokens served", num: true },
      { title: "share", num: true },
      { title: "refused, by reason" },
    ],
    live.tenants.map((t) => [
      t.tenant,
      String(t.in_service),
      String(t.waiting),
      count(t.requests),
      count(t.served_tokens),
      `${Math.round(t.share * 100)}%`,
      Object.entries(t.refused || {})
        .map(([k, v]) => `${k} ${v}`)
        .join(", ") || "-",
    ]),
    { id: "tenants", empty: "no tenant yet" },
  );
  return [
    h("h1", {}, "Live ", h("span", { class: "muted small" }, `slotgate ${live.version} · up ${seconds(live.uptime_seconds)}`)),
    cards,
    h("h2", {}, `Running (${inside.length})`),
    running,
    h("h2", {}, `Waiting (${q.depth}), in the order they will be served`),
    waiting,
    h("h2", {}, "Tenants"),
    tenants,
  ];
}

function card(title, value, detail) {
  return h("div", { class: "card stat" }, h("div", { class: "label" }, title), h("div", { class: "value" }, value), h("div", { class: "muted small" }, detail));
}

/** Why a waiter has no slot yet, from what /live shows. */
function reason(w, i, live) {
  const s = live.slots;
  const why = [];
  if (s.busy >= s.total) why.push(`all ${s.total} slots busy`);
  else if (s.kv_pool_tokens != null && w.kv_tokens > s.kv_pool_tokens - s.kv_reserved_tokens) {
    why.push(`needs ${count(w.kv_tokens)} KV tokens, ${count(s.kv_pool_tokens - s.kv_reserved_tokens)} free`);
  } else {
    why.push("a slot is free: held back by its tenant's or team's cap");
  }
  if (i > 0) why.push(`${i} ahead of it`);
  if (w.effective_priority !== w.priority) why.push("aged up");
  if (w.band) why.push(`band ${w.band}`);
  if (w.model) why.push(`model ${w.model}`);
  return why.join("; ");
}
