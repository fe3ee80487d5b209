// The admin listener's JSON routes, called with the operator's token. The token lives in this
// tab's session storage only: never in the URL, the page, or local storage.

const KEY = "slotgate.admin-token";

export const session = {
  token() {
    return sessionStorage.getItem(KEY);
  },
  keep(token) {
    sessionStorage.setItem(KEY, token);
  },
  forget() {
    sessionStorage.removeItem(KEY);
  },
};

/** An answer that was not 2xx, with the API's own message. */
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Called with the error when a call gets 401: the token is wrong, or was replaced. */
let onUnauthorized = () => {};
export function whenUnauthorized(f) {
  onUnauthorized = f;
}

/**
 * One call. `body` is sent as JSON; the answer is parsed as JSON, or returned as text with
 * `{text: true}`. A refusal throws an ApiError carrying slotgate's message.
 */
export async function call(method, path, body, { text = false, quiet401 = false } = {}) {
  const headers = {};
  const token = session.token();
  if (token) headers["Authorization"] = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch (e) {
    throw new ApiError(0, `slotgate did not answer ${method} ${path}: ${e.message}`, "unreachable");
  }
  if (!resp.ok) {
    let message = `${method} ${path}: ${resp.status} ${resp.statusText}`;
    let code;
    try {
      const j = await resp.json();
      if (j && j.error && j.error.message) {
        message = `${method} ${path}: ${j.error.message}`;
        code = j.error.code;
      }
    } catch {
      // Not JSON: the status says it.
    }
    const err = new ApiError(resp.status, message, code);
    if (resp.status === 401 && !quiet401) onUnauthorized(err);
    throw err;
  }
  return text ? resp.text() : resp.json();
}

export const get = (path, opts) => call("GET", path, undefined, opts);
export const post = (path, body, opts) => call("POST", path, body, opts);
