// Keys: the list, and with the admin token, create, rotate and revoke. A new secret is shown
// once, in a box that is removed when dismissed or when the page changes; nothing keeps it.
import { get, post } from "./api.js";
import { confirmButton, fill, h, table, when } from "./dom.js";

let root = null;
let context = null;
/** The box showing a new secret, while it is shown. */
let secretBox = null;

export function show(el, ctx) {
  root = el;
  context = ctx;
  if (ctx.role === "read") {
    fill(
      root,
      h("h1", {}, "Keys"),
      h(
        "p",
        { class: "notice", id: "keys-read-only" },
        "The keys need the admin token: the read-only token may not list, create, rotate or revoke them.",
      ),
    );
    return;
  }
  load();
}

export function hide() {
  dismissSecret();
  root = null;
}

function dismissSecret() {
  if (secretBox) secretBox.remove();
  secretBox = null;
}

async function load(message) {
  const el = root;
  let list;
  try {
    list = await get("/keys");
  } catch (e) {
    if (el === root && el) fill(el, h("h1", {}, "Keys"), h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  if (el !== root || !el) return;
  const status = h("p", { id: "keys-status", class: message ? "ok" : "muted", role: "status" }, message || "");
  const box = secretBox;
  fill(el, h("h1", {}, "Keys"), createForm(status), box, status, keyTable(list.keys, status), graceChoice());
}

/** How long a rotated key's old secret keeps working (`grace`, docs/keys.md). */
let grace = "0s";
function graceChoice() {
  const pick = h(
    "select",
    { id: "rotate-grace" },
    [
      ["0s", "stops at once"],
      ["5m", "works 5 more minutes"],
      ["1h", "works 1 more hour"],
      ["24h", "works 1 more day"],
    ].map(([v, label]) => h("option", { value: v, selected: v === grace }, label)),
  );
  pick.addEventListener("change", () => (grace = pick.value));
  return h("p", { class: "muted small" }, h("label", {}, "After a rotation, the old secret ", pick));
}

function createForm(status) {
  const field = (name, label, hint) =>
    h("label", {}, label, h("input", { name, id: `new-${name}`, placeholder: hint, autocomplete: "off", spellcheck: "false" }));
  const form = h(
    "form",
    { class: "card inline", id: "create-key", autocomplete: "off" },
    h("strong", {}, "New key"),
    field("tenant", "tenant", "alice"),
    field("team", "team", "research (optional)"),
    field("models", "models", "any (or a,b)"),
    field("expires", "expires", "never (or 90d)"),
    h("button", { type: "submit" }, "Create"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const v = (n) => form.elements[n].value.trim();
    const body = { tenant: v("tenant") };
    if (v("team")) body.team = v("team");
    if (v("models")) body.models = v("models").split(",").map((m) => m.trim()).filter(Boolean);
    if (v("expires")) body.expires = v("expires");
    try {
      const made = await post("/keys", body);
      form.reset();
      showSecret(made, "created");
      await load(`Key ${made.id} created for tenant ${made.tenant}.`);
    } catch (e) {
      status.className = "error";
      status.textContent = e.message;
    }
  });
  return form;
}

function showSecret(made, what) {
  dismissSecret();
  const secret = h("code", { id: "secret" }, made.secret);
  const copy = h("button", { type: "button", id: "copy-secret" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(secret.textContent);
      copy.textContent = "Copied";
    } catch (e) {
      copy.textContent = "Copy failed: select it by hand";
    }
  });
  const done = h("button", { type: "button", id: "dismiss-secret" }, "I have copied it");
  done.addEventListener("click", dismissSecret);
  secretBox = h(
    "div",
    { class: "card secret", id: "secret-box", role: "dialog", "aria-label": "the new secret" },
    h("p", {}, h("strong", {}, `Key ${made.id} ${what} for tenant ${made.tenant}. `), "Copy its secret now: it is shown this once, and slotgate keeps only its digest."),
    h("p", {}, secret, " ", copy, " ", done),
  );
  made.secret = undefined;
}

function keyTable(keys, status) {
  const admin = context.role !== "read";
  const act = (label, confirm, path, body, done, id) =>
    confirmButton(label, confirm, async () => {
      try {
        const r = await post(path, typeof body === "function" ? body() : body);
        done(r);
      } catch (e) {
        status.className = "error";
        status.textContent = e.message;
      }
    }, { "data-key": id, class: `act-${label.toLowerCase()}` });
  const rows = keys.map((k) => {
    const actions = [];
    if (admin && k.source !== "file" && k.state === "active") {
      actions.push(
        act("Rotate", "Confirm rotate", `/keys/${encodeURIComponent(k.id)}/rotate`, () => ({ grace }), async (r) => {
          showSecret(r, "rotated");
          const old = r.old_secret_until ? `its old secret works until ${when(r.old_secret_until)}` : "its old secret no longer works";
          await load(`Key ${r.id} rotated: ${old}.`);
        }, k.id),
        " ",
        act("Revoke", "Confirm revoke", `/keys/${encodeURIComponent(k.id)}/revoke`, undefined, async (r) => {
          await load(`Key ${r.id} of tenant ${r.tenant} revoked: its next request gets 401.`);
        }, k.id),
      );
    } else if (k.source === "file") {
      actions.push(h("span", { class: "muted" }, "in the keys file"));
    }
    const cells = [
      h("code", {}, k.id),
      k.tenant,
      k.team || "-",
      k.models && k.models.length ? k.models.join(", ") : "any",
      h("span", { class: `state ${k.state}` }, k.state),
      when(k.created),
      when(k.last_used),
      k.expires ? when(k.expires) : "never",
      actions,
    ];
    cells.attrs = { "data-key": k.id, "data-state": k.state };
    return cells;
  });
  return table(
    [
      { title: "id" },
      { title: "tenant" },
      { title: "team" },
      { title: "models" },
      { title: "state" },
      { title: "created" },
      { title: "last used" },
      { title: "expires" },
      { title: "" },
    ],
    rows,
    { id: "keys", empty: "no key yet" },
  );
}
