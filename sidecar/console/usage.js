// Usage: the ledger per day and tenant (GET /usage?by=day,tenant) as a stacked bar chart and a
// table, with its cost when prices are set, and the same rows as a CSV download.
import { get } from "./api.js";
import { count, fill, h, money, table } from "./dom.js";

let root = null;
let chart = null;
let range = null;

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

export function show(el) {
  root = el;
  load(range);
}

export function hide() {
  if (chart) chart.destroy();
  chart = null;
  root = null;
}

/** uPlot, loaded the first time a chart is drawn (the live view does without it). */
let uplot = null;
function loadUplot() {
  if (!uplot) {
    uplot = new Promise((resolve, reject) => {
      document.head.append(h("link", { rel: "stylesheet", href: "vendor/uplot/uPlot.min.css" }));
      const s = h("script", { src: "vendor/uplot/uPlot.iife.min.js" });
      s.addEventListener("load", () => resolve(window.uPlot));
      s.addEventListener("error", () => {
        uplot = null;
        reject(new Error("the chart library did not load"));
      });
      document.head.append(s);
    });
  }
  return uplot;
}

const METRICS = [
  ["tokens", "tokens (prompt + generated)"],
  ["requests", "requests"],
  ["prompt_tokens", "prompt tokens"],
  ["cached_tokens", "cached prompt tokens"],
  ["completion_tokens", "generated tokens"],
  ["cost", "cost"],
];

function value(row, metric) {
  if (metric === "tokens") return (row.prompt_tokens || 0) + (row.completion_tokens || 0);
  return row[metric] || 0;
}

function query(r, csv) {
  const p = new URLSearchParams({ by: "day,tenant" });
  if (r) {
    p.set("from", r.from);
    p.set("to", r.to);
  }
  if (csv) p.set("format", "csv");
  return `/usage?${p}`;
}

async function load(r, metric = "tokens") {
  const el = root;
  let answer;
  try {
    answer = await get(query(r));
  } catch (e) {
    if (el === root && el) fill(el, h("h1", {}, "Usage"), controls(r || {}, metric), h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  if (el !== root || !el) return;
  range = { from: answer.from, to: answer.to };
  const priced = "currency" in answer;
  if (metric === "cost" && !priced) metric = "tokens";
  const byTenant = new Map();
  for (const row of answer.rows) {
    const t = byTenant.get(row.tenant) || { tenant: row.tenant, requests: 0, prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0, cost: 0 };
    for (const k of ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost"]) t[k] += row[k] || 0;
    byTenant.set(row.tenant, t);
  }
  const plot = h("div", { id: "usage-chart", class: "chart" });
  const numbers = (x) => [count(x.requests), count(x.prompt_tokens), count(x.cached_tokens), count(x.completion_tokens), ...(priced ? [money(x.cost, answer.currency)] : [])];
  const numberColumns = [
    { title: "requests", num: true },
    { title: "prompt tokens", num: true },
    { title: "cached", num: true },
    { title: "generated", num: true },
    ...(priced ? [{ title: `cost (${answer.currency})`, num: true }] : []),
  ];
  const tenantRows = [...byTenant.values()].map((t) => [t.tenant, ...numbers(t)]);
  if (tenantRows.length) {
    const total = [h("strong", {}, "total"), ...numbers(answer.total)];
    total.attrs = { class: "total" };
    tenantRows.push(total);
  }
  fill(
    el,
    h("h1", {}, "Usage"),
    controls(range, metric, priced),
    h("h2", {}, `Per day and tenant, ${answer.from} to ${answer.to}`),
    answer.rows.length ? plot : h("p", { class: "muted" }, "No request reached llama-server in these days."),
    h("h2", {}, "Per tenant"),
    table([{ title: "tenant" }, ...numberColumns], tenantRows, { id: "usage-tenants", empty: "no usage" }),
    h("h2", {}, "Per day and tenant"),
    table(
      [{ title: "day" }, { title: "tenant" }, ...numberColumns],
      answer.rows.map((r) => [r.day, r.tenant, ...numbers(r)]),
      { id: "usage-rows", empty: "no usage" },
    ),
  );
  if (answer.rows.length) draw(plot, answer, metric, priced).catch((e) => fill(plot, h("p", { class: "error" }, e.message)));
}

function controls(r, metric, priced = true) {
  const from = h("input", { type: "date", id: "usage-from", value: r.from || "" });
  const to = h("input", { type: "date", id: "usage-to", value: r.to || "" });
  const pick = h(
    "select",
    { id: "usage-metric" },
    METRICS.filter(([m]) => priced || m !== "cost").map(([m, label]) => h("option", { value: m, selected: m === metric }, label)),
  );
  const form = h(
    "form",
    { class: "card inline", id: "usage-range" },
    h("label", {}, "from ", from),
    h("label", {}, "to ", to),
    h("label", {}, "chart ", pick),
    h("button", { type: "submit" }, "Show"),
    h("button", { type: "button", id: "usage-csv" }, "Download CSV"),
    h("span", { id: "usage-csv-status", class: "muted", role: "status" }),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    load({ from: from.value, to: to.value }, pick.value);
  });
  pick.addEventListener("change", () => load({ from: from.value, to: to.value }, pick.value));
  form.querySelector("#usage-csv").addEventListener("click", () => download({ from: from.value, to: to.value }, form.querySelector("#usage-csv-status")));
  return form;
}

/** The CSV, fetched with the token (a plain link could not send it) and saved from memory. */
async function download(r, status) {
  status.textContent = "";
  let text;
  try {
    text = await get(query(r.from && r.to ? r : null, true), { text: true });
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
    return;
  }
  const url = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
  const a = h("a", { href: url, download: `slotgate-usage-${r.from}-${r.to}.csv`, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  status.className = "muted";
  status.textContent = `${text.trim().split("\n").length - 1} rows saved.`;
}

/** Days from..to as Unix seconds at UTC midnight (the chart's x), with every day present. */
function days(from, to) {
  const out = [];
  for (let t = Date.parse(`${from}T00:00:00Z`); t <= Date.parse(`${to}T00:00:00Z`); t += 86400000) out.push(t / 1000);
  return out;
}

async function draw(el, answer, metric, priced) {
  const uPlot = await loadUplot();
  if (!el.isConnected) return;
  const xs = days(answer.from, answer.to);
  const index = new Map(xs.map((x, i) => [new Date(x * 1000).toISOString().slice(0, 10), i]));
  const tenants = [...new Set(answer.rows.map((r) => r.tenant))].sort();
  const raw = tenants.map(() => xs.map(() => 0));
  for (const r of answer.rows) {
    const i = index.get(r.day);
    if (i !== undefined) raw[tenants.indexOf(r.tenant)][i] += value(r, metric);
  }
  // Stacked: each series is the sum of those below it; the tallest is drawn first.
  // A day without use is no bar at all, not a bar of height 0.
  const stacked = raw.map((_, s) => xs.map((_, i) => raw.slice(0, s + 1).reduce((a, row) => a + row[i], 0) || null));
  const order = tenants.map((_, s) => tenants.length - 1 - s);
  const label = METRICS.find(([m]) => m === metric)[1] + (metric === "cost" && priced ? ` (${answer.currency})` : "");
  const bars = uPlot.paths.bars({ size: [0.7, 60] });
  if (chart) chart.destroy();
  chart = new uPlot(
    {
      width: Math.max(320, el.clientWidth || 800),
      height: 280,
      scales: {
        x: { time: true, range: (u, lo, hi) => [lo - 43200, hi + 43200] },
        y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] },
      },
      axes: [{}, { label, size: 70, values: (u, vals) => vals.map((v) => (metric === "cost" ? money(v) : count(v))) }],
      legend: { live: true },
      series: [
        { label: "day", value: (u, v) => (v == null ? "-" : new Date(v * 1000).toISOString().slice(0, 10)) },
        ...order.map((s) => ({
          label: tenants[s],
          stroke: COLORS[s % COLORS.length],
          fill: COLORS[s % COLORS.length] + "cc",
          paths: bars,
          points: { show: false },
          value: (u, v, si, i) => (i == null ? "-" : metric === "cost" ? money(raw[s][i]) : count(raw[s][i])),
        })),
      ],
    },
    [xs, ...order.map((s) => stacked[s])],
    el,
  );
}
