// Quotas: every quota this sidecar holds in its current window, by tenant, team and key, with
// what is left. Rows are drawn from whatever fields GET /quotas gives, so a new kind of quota
// (a budget in money, say) shows without a change here.
import { get } from "./api.js";
import { count, fill, h, meter, table, when } from "./dom.js";

let root = null;

export function show(el) {
  root = el;
  load();
}

export function hide() {
  root = null;
}

/** The fields shown first, in this order; any other field follows them. */
const FIRST = ["kind", "period", "limit", "used", "left"];
/** Fields shown in another way (the key is split into what and whom). */
const SHOWN_APART = new Set(["policy", "key", "window_start", "window_end"]);

/** `tokens:team:research\u001fbig-model` → {measure, scope, who, model}. */
export function parseKey(key) {
  const [head, model] = String(key).split("\u001f");
  const i = head.indexOf(":");
  if (i < 0) return { measure: head, scope: "other", who: "-", model };
  const measure = head.slice(0, i);
  const rest = head.slice(i + 1);
  for (const scope of ["team", "key"]) {
    if (rest.startsWith(`${scope}:`)) return { measure, scope, who: rest.slice(scope.length + 1), model };
  }
  return { measure, scope: "tenant", who: rest, model };
}

async function load() {
  const el = root;
  let answer;
  try {
    answer = await get("/quotas");
  } catch (e) {
    if (el === root && el) fill(el, h("h1", {}, "Quotas"), h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  if (el !== root || !el) return;
  const rows = answer.quotas || [];
  const fields = [];
  for (const f of FIRST) if (rows.some((r) => f in r)) fields.push(f);
  for (const r of rows) for (const f of Object.keys(r)) if (!fields.includes(f) && !SHOWN_APART.has(f)) fields.push(f);
  const sections = [
    ["tenant", "Per tenant"],
    ["team", "Per team"],
    ["key", "Per key"],
    ["other", "Other"],
  ];
  const parts = [h("h1", {}, "Quotas")];
  if (!rows.length) {
    parts.push(h("p", { class: "muted" }, "No quota is in use in its current window: a quota shows once a request has used it (docs/quotas.md)."));
  }
  for (const [scope, title] of sections) {
    const mine = rows.filter((r) => parseKey(r.key).scope === scope);
    if (!mine.length) continue;
    parts.push(
      h("h2", {}, title),
      table(
        [
          { title: scope === "other" ? "key" : scope },
          { title: "quota" },
          ...fields.map((f) => ({ title: f.replaceAll("_", " "), num: typeof mine[0][f] === "number" })),
          { title: "left of limit" },
          { title: "resets" },
          { title: "policy" },
        ],
        mine.map((r) => {
          const k = parseKey(r.key);
          const cells = [
            scope === "other" ? r.key : k.who,
            k.model ? `${k.measure} (${k.model})` : k.measure,
            ...fields.map((f) => cell(r[f], r)),
            meter(r.left, r.limit),
            when(r.window_end),
            r.policy,
          ];
          cells.attrs = { "data-quota": r.key };
          return cells;
        }),
        { id: `quotas-${scope}` },
      ),
    );
  }
  fill(el, parts);
}

function cell(v, row) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") return row.currency ? `${count(v)} ${row.currency}` : count(v);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
