// Small DOM helpers. Text is always set as text (never parsed as HTML), so a tenant's name or a
// model's cannot become markup.

/** An element: `h("td", {class: "num"}, "12")`; children may be strings, nodes, arrays or null. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** A table: `columns` of {title, num?}, `rows` of arrays of cells; `empty` when there are none. */
export function table(columns, rows, { empty = "none", id, caption } = {}) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)));
  const body = rows.length
    ? rows.map((cells) =>
        h(
          "tr",
          cells.attrs || {},
          cells.map((cell, i) => h("td", { class: columns[i] && columns[i].num ? "num" : null }, cell)),
        ),
      )
    : [h("tr", { class: "empty" }, h("td", { colspan: columns.length }, empty))];
  return h("table", { id, class: "grid" }, caption ? h("caption", {}, caption) : null, h("thead", {}, head), h("tbody", {}, body));
}

/** Replaces what `el` holds. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(1)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
}

export function count(n) {
  if (n === null || n === undefined) return "-";
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(2)}M`;
  if (Math.abs(n) >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return Number.isInteger(n) ? String(n) : n.toFixed(2);
}

/** A number of a currency, with as many decimals as a small cost needs. */
export function money(n, currency) {
  if (n === null || n === undefined) return "-";
  const digits = Math.abs(n) >= 1 ? 2 : Math.abs(n) >= 0.01 ? 4 : 6;
  return `${n.toFixed(digits)}${currency ? " " + currency : ""}`;
}

/** An RFC 3339 time as local time, and how far it is from now. */
export function when(t) {
  if (!t) return "-";
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  const s = (d.getTime() - Date.now()) / 1000;
  const rel = s >= 0 ? `in ${seconds(s)}` : `${seconds(-s)} ago`;
  return `${d.toLocaleString()} (${rel})`;
}

/** A bar showing `part` of `whole`. */
export function meter(part, whole) {
  if (typeof part !== "number" || typeof whole !== "number" || whole <= 0) return "";
  const share = Math.max(0, Math.min(1, part / whole));
  const m = h("meter", { min: 0, max: 1, low: 0.1, high: 0.9, optimum: 1, value: share.toFixed(3) });
  m.title = `${Math.round(share * 100)}% left`;
  return m;
}

/** A button that asks once more before `act`: the first click arms it for a few seconds. */
export function confirmButton(label, confirmLabel, act, attrs = {}) {
  const b = h("button", { type: "button", ...attrs }, label);
  let armed = null;
  b.addEventListener("click", async () => {
    if (!armed) {
      b.textContent = confirmLabel;
      b.classList.add("armed");
      armed = setTimeout(() => {
        armed = null;
        b.textContent = label;
        b.classList.remove("armed");
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    b.disabled = true;
    try {
      await act();
    } finally {
      b.disabled = false;
      b.textContent = label;
      b.classList.remove("armed");
    }
  });
  return b;
}
