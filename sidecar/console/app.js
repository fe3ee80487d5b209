// The console's frame: signing in with a token, what that token may do, the pages and the
// error banner. Each page is a module with show(ctx) and hide().
import { ApiError, get, session, whenUnauthorized } from "./api.js";
import * as live from "./live.js";
import * as keys from "./keys.js";
import * as quotas from "./quotas.js";
import * as usage from "./usage.js";

const pages = { live, keys, quotas, usage };
const $ = (id) => document.getElementById(id);

/** What the page knows of its caller: `role` is `admin`, `read` or `open` (no token configured). */
const ctx = {
  role: null,
  version: null,
  clear() {
    $("error").hidden = true;
  },
};

let current = null;

function showError(message) {
  const el = $("error");
  el.textContent = message;
  el.hidden = false;
}

function showLogin(message) {
  if (current) pages[current].hide();
  current = null;
  ctx.role = null;
  for (const p of document.querySelectorAll(".page")) {
    p.hidden = true;
    p.replaceChildren();
  }
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("error").hidden = true;
  $("login").hidden = false;
  const err = $("login-error");
  err.textContent = message || "";
  err.hidden = !message;
  $("token").focus();
}

/** Which token this is: the admin one reads the keys, the read-only one is refused them. */
async function roleOf() {
  try {
    await get("/keys", { quiet401: true });
    return session.token() ? "admin" : "open";
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return "read";
    throw e;
  }
}

async function signIn() {
  let status;
  try {
    status = await get("/status", { quiet401: true });
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      const had = session.token();
      session.forget();
      showLogin(
        had
          ? "slotgate refused that token: it is neither the admin token nor the read-only token of this listener."
          : "",
      );
      return;
    }
    showLogin(e.message);
    return;
  }
  ctx.version = status.version;
  try {
    ctx.role = await roleOf();
  } catch (e) {
    showLogin(e.message);
    return;
  }
  $("login").hidden = true;
  $("nav").hidden = false;
  $("logout").hidden = ctx.role === "open";
  document.body.dataset.role = ctx.role;
  $("who").textContent = {
    admin: "admin token",
    read: "read-only token: nothing can be changed",
    open: "no admin token configured: anyone who reaches this listener may change things",
  }[ctx.role];
  route();
}

function route() {
  if (!ctx.role) return;
  const name = location.hash.slice(1) in pages ? location.hash.slice(1) : "live";
  if (current === name) return;
  if (current) {
    pages[current].hide();
    $(`page-${current}`).hidden = true;
  }
  ctx.clear();
  current = name;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("current", a.dataset.page === name);
  }
  const el = $(`page-${name}`);
  el.hidden = false;
  pages[name].show(el, ctx);
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = $("token");
  const token = input.value.trim();
  // The field does not keep it: the token is in session storage only.
  input.value = "";
  if (!token) return;
  session.keep(token);
  signIn();
});

$("logout").addEventListener("click", () => {
  session.forget();
  showLogin("Signed out.");
});

whenUnauthorized(() => {
  session.forget();
  showLogin("slotgate no longer accepts this token (was it replaced?). Sign in again.");
});

// A failure no page caught is shown, not lost in the browser's console.
window.addEventListener("unhandledrejection", (ev) => {
  showError(ev.reason instanceof Error ? ev.reason.message : String(ev.reason));
});
window.addEventListener("error", (ev) => showError(ev.message));
window.addEventListener("hashchange", route);
signIn();
