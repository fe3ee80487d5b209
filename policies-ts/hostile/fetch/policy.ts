/**
 * Hostile fixture: reaches for the network, the files and the environment in every way JavaScript
 * offers, and denies every request (403) with what happened to each: `name: blocked (why)`, or
 * `name: ALLOWED (what it got)` if one ever worked, so a test can look for `ALLOWED`.
 *
 * Some attempts cannot be caught. In a component built with every WASI feature disabled (`jco
 * componentize --disable all`, as slotgate's scripts build), componentize-js wires `fetch()` and a
 * module loaded at run time (`import(name)`) to a trap: the call ends the instance, the policy
 * fails and its `on_error` applies, and nothing is sent or read. So by default it reports what the
 * globals are without calling those two; with settings `{"call_fetch": true}` it calls
 * `fetch('http://127.0.0.1:9')`, and with `{"call_import": true}` imports `node:fs`, for a request
 * of the model `HOSTILE` (any other still gets the report, so the load-time canary passes and the
 * policy serves).
 */

import type { Completion, Decision, Evaluation, SettingsVerdict } from 'slotgate:policy/types@2.0.0';

interface Settings {
  call_fetch?: boolean;
  call_import?: boolean;
}

const g = globalThis as Record<string, any>;

export function validateSettings(_settings: string): SettingsVerdict {
  return { needsPromptTokens: false, wantsCompletions: false };
}

export function evaluate(settings: string, input: Evaluation): Decision {
  const s = (JSON.parse(settings) ?? {}) as Settings;
  const hostile = input.request.model === 'HOSTILE';
  const report: string[] = [];
  const attempt = (name: string, run: () => unknown) => {
    try {
      const got = run();
      report.push(got === undefined ? `${name}: blocked (not there)` : `${name}: ALLOWED (${describe(got)})`);
    } catch (e) {
      report.push(`${name}: blocked (${String(e)})`);
    }
  };

  // The environment and the files, as Node, Deno and Bun offer them.
  attempt('process.env', () => g.process?.env);
  attempt("require('fs')", () => g.require?.('fs'));
  attempt('Deno.env', () => g.Deno?.env?.toObject());
  attempt('Bun.file', () => g.Bun?.file('/etc/passwd'));
  // The network, as browsers offer it besides fetch.
  attempt('XMLHttpRequest', () => new g.XMLHttpRequest().open('GET', 'http://127.0.0.1:9'));
  attempt('WebSocket', () => new g.WebSocket('ws://127.0.0.1:9'));
  attempt('navigator.sendBeacon', () => g.navigator?.sendBeacon('http://127.0.0.1:9', 'x'));
  // A nested engine to smuggle anything through.
  attempt('WebAssembly', () => g.WebAssembly);

  if (s.call_fetch === true && hostile) {
    // A trap in this build: nothing after it runs.
    attempt("fetch('http://127.0.0.1:9')", () => {
      const pending = g.fetch('http://127.0.0.1:9');
      // A synchronous export cannot await; the request was at most queued.
      return `a ${Object.prototype.toString.call(pending)} that a synchronous export cannot await`;
    });
  } else {
    report.push(`fetch: not called (a ${typeof g.fetch}; {"call_fetch": true} calls it for model HOSTILE)`);
  }
  if (s.call_import === true && hostile) {
    // A variable specifier, so the bundler leaves the import to run time (a literal `node:fs` fails
    // the build: see sdk-ts/bundle.config.mjs).
    const specifier = ['node', 'fs'].join(':');
    attempt(`import('${specifier}')`, () => import(specifier));
  }

  return { tag: 'deny', val: { status: 403, message: report.join('; '), rateLimits: {} } };
}

export function onComplete(_settings: string, _completion: Completion): void {}

function describe(v: unknown): string {
  if (typeof v === 'object' && v !== null) return Object.prototype.toString.call(v);
  return `${typeof v} ${String(v)}`.slice(0, 200);
}
