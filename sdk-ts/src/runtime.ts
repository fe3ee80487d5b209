/**
 * The JavaScript globals a component built with every WASI feature disabled (`jco componentize
 * --disable all`, as slotgate builds them) would otherwise get wrong, routed through the world's
 * own imports instead:
 *
 * - `console.*` writes to stdio, which the component does not import: its lines would vanish.
 *   They go to the host's log (tagged with the policy's name) at the matching level.
 * - `Date.now()` would answer the time the component was built (the engine is pre-initialised
 *   then, and has no clock of its own). It answers the host's wall clock.
 *
 * `new Date()` and `Math.random()` are not patched: the first is still the build time, the second
 * repeats the same sequence in every call (each call starts from the same snapshot). Use the
 * evaluation's `nowUnixMs`.
 *
 * Under Node (unit tests) nothing is patched: Node's console and clock are the real ones.
 */

import { log, type Level } from 'slotgate:policy/log@2.0.0';
import { wallMs } from 'slotgate:policy/clocks@2.0.0';

/** StarlingMonkey has no `process`; Node always has. */
const inComponent = typeof (globalThis as { process?: unknown }).process === 'undefined';

if (inComponent) {
  const to = (level: Level) => (...args: unknown[]) => log(level, args.map(text).join(' '));
  // QuickJS (jco's other engine) has no console at all.
  const c = ((globalThis as { console?: Partial<Console> }).console ??= {});
  c.log = to('info');
  c.info = to('info');
  c.warn = to('warn');
  c.error = to('error');
  c.debug = to('debug');
  c.trace = to('debug');
  Date.now = () => Number(wallMs());
}

function text(value: unknown): string {
  if (typeof value === 'string') return value;
  // StarlingMonkey's `stack` is the frames only.
  if (value instanceof Error) return `${value.name}: ${value.message}${value.stack ? `\n${value.stack}` : ''}`;
  try {
    // The WIT's 64-bit integers are bigints, which JSON.stringify refuses.
    return JSON.stringify(value, (_, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)) ?? String(value);
  } catch {
    return String(value);
  }
}
