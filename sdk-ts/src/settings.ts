/**
 * Settings and errors across the component boundary.
 *
 * componentize-js maps a WIT `result<T, string>` onto exceptions, both ways: an export returns its
 * `err` by throwing the string (an `Error` object thrown out of an export is a trap instead), and
 * an import's `err` arrives as a thrown `ComponentError` whose `payload` is the string.
 */

import type { SettingsVerdict } from 'slotgate:policy/types@2.0.0';

/** The operator's settings: the JSON text the host passes, `null` when none were given. */
export function parseSettings(json: string): unknown {
  return JSON.parse(json) as unknown;
}

/**
 * `parse` (settings text to your settings) remembering its last answer. An instance may serve
 * several calls of one caller (docs/policies.md, "Isolation") and the text is the same for all of
 * them, so `const settings = kept((json) => readSettings(parseSettings(json)))` parses it once per
 * instance instead of on every call. Treat what it returns as read-only: the next call gets the
 * same object.
 */
export function kept<T>(parse: (json: string) => T): (json: string) => T {
  let lastText: string | undefined;
  let last: T | undefined;
  return (json: string): T => {
    if (lastText !== json) {
      last = parse(json);
      lastText = json;
    }
    return last as T;
  };
}

/**
 * Runs `check` as the body of `validateSettings`, so it can throw `Error`s like any TypeScript: what
 * it throws becomes the WIT error the operator sees, not a trap.
 */
export function checkSettings(check: () => SettingsVerdict): SettingsVerdict {
  try {
    return check();
  } catch (e) {
    // A string is what componentize-js turns into `err(string)`.
    throw errorMessage(e);
  }
}

/** The message of anything thrown: a WIT error's payload, an `Error`'s message, or the value. */
export function errorMessage(e: unknown): string {
  if (typeof e === 'string') return e;
  if (typeof e === 'object' && e !== null) {
    const { payload, message } = e as { payload?: unknown; message?: unknown };
    if (typeof payload === 'string') return payload;
    if (typeof message === 'string') return message;
  }
  return String(e);
}
