/**
 * The fake host: an in-memory stand-in for the host side of the world (`log`, `clocks`, `state`)
 * with the same bucket, window and quota arithmetic as slotgate's (`sdk/src/host/emulated.rs`,
 * `sdk/src/bucket.rs`), on a manual clock. Under `node --test`, the WIT imports a policy makes
 * (`slotgate:policy/state@2.0.0`, ...) resolve to modules that call the one {@link fakeHost}
 * (see `register.ts`), so a test arranges and inspects host state through it.
 *
 * Like slotgate's, state survives between calls; call `reset()` where a test needs a clean slate.
 * Unlike slotgate, nothing isolates one call from the next: module-level variables of the policy
 * keep their values in tests, while in slotgate every call starts from the component's initial
 * state.
 */

import type { Level } from 'slotgate:policy/log@2.0.0';

import { type Period, parsePeriod, periodWindow } from './calendar.js';

/** The fake wall clock at monotonic 0: the same instant as the Rust SDK's emulated host. */
export const WALL_START_MS = 1_800_000_000_000;

/** The most bytes of a state key (or quota period) the host takes; a longer one traps. */
const MAX_KEY_BYTES = 4096;

/** The most bytes of a log message the host keeps. */
const MAX_LOG_BYTES = 4096;

/**
 * The error an import's WIT `err` arrives as, shaped like componentize-js's: its `payload` is the
 * string. (In a component it is not an `Error`; use the SDK's `errorMessage()` to read either.)
 */
export class ComponentError extends Error {
  constructor(readonly payload: string) {
    super(payload);
    this.name = 'ComponentError';
  }
}

/** What the host does when a guest breaks the contract: the call fails, as a trap would. */
export class Trap extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'Trap';
  }
}

interface Bucket {
  level: number;
  updatedMs: number;
  /** As the last call gave it. */
  capacity: number;
}

interface Window {
  events: Array<[at: number, amount: number]>;
  total: number;
}

export class FakeHost {
  #nowMs = 0;
  /** Where the wall clock is ahead of `WALL_START_MS + nowMs` (set by a test). */
  #wallOffsetMs = 0;
  #buckets = new Map<string, Bucket>();
  #windows = new Map<string, Window>();
  #logs: Array<[Level, string]> = [];
  #events: string[] = [];
  /** Operators' quota limits, by key and period. */
  #quotaLimits = new Map<string, number>();

  // --- What tests use -----------------------------------------------------------------------

  /** Forgets all state, logs and events; the clocks go back to their start. */
  reset(): void {
    this.#nowMs = 0;
    this.#wallOffsetMs = 0;
    this.#buckets.clear();
    this.#windows.clear();
    this.#logs = [];
    this.#events = [];
    this.#quotaLimits.clear();
  }

  /** Moves both clocks forward, refilling buckets, ageing windows, reaching later quota windows. */
  advanceMs(ms: number): void {
    this.#nowMs += Math.max(0, ms);
  }

  /** Sets the wall clock (and so the quota windows) to `unixMs`; `advanceMs` moves on from there. */
  setWallMs(unixMs: number): void {
    this.#wallOffsetMs = unixMs - WALL_START_MS - this.#nowMs;
  }

  /** The wall clock now, in Unix milliseconds, as a number. */
  nowUnixMs(): number {
    return WALL_START_MS + this.#nowMs + this.#wallOffsetMs;
  }

  /**
   * Sets (or, with undefined, removes) an operator's limit for a quota, as the quota admin API
   * does: the current window keeps what it used, so what is left moves by the difference.
   */
  setQuotaLimit(key: string, period: string, limit: number | undefined): void {
    const { bucket } = this.#quotaWindow(key, period, 0);
    const id = `${key}\u0000${period}`;
    if (limit === undefined) {
      this.#quotaLimits.delete(id);
      return;
    }
    const b = this.#buckets.get(bucket);
    if (b !== undefined) {
      b.level += limit - b.capacity;
      b.capacity = limit;
    }
    this.#quotaLimits.set(id, limit);
  }

  /** The messages logged since the last call (or `reset`). */
  takeLogs(): Array<[Level, string]> {
    const logs = this.#logs;
    this.#logs = [];
    return logs;
  }

  /** The events counted since the last call (or `reset`). */
  takeEvents(): string[] {
    const events = this.#events;
    this.#events = [];
    return events;
  }

  // --- The world's imports ------------------------------------------------------------------

  log(level: Level, message: string): void {
    this.#logs.push([level, cutBytes(message, MAX_LOG_BYTES)]);
  }

  monotonicMs(): bigint {
    return BigInt(this.#nowMs);
  }

  wallMs(): bigint {
    return BigInt(this.nowUnixMs());
  }

  bucketTake(key: string, capacity: number, refillPerSec: number, amount: number): number {
    const b = this.#bucket(key, capacity, refillPerSec);
    if (b.level >= amount) {
      b.level -= amount;
      return 0;
    }
    if (refillPerSec <= 0 || amount > capacity) return Infinity;
    return (amount - b.level) / refillPerSec;
  }

  bucketRefund(key: string, capacity: number, refillPerSec: number, amount: number): number {
    const b = this.#bucket(key, capacity, refillPerSec);
    b.level = Math.min(b.level + amount, capacity);
    return b.level;
  }

  bucketLevel(key: string, capacity: number, refillPerSec: number): number {
    checkKey(key);
    const b = this.#buckets.get(key);
    if (b === undefined) return capacity;
    return refilled(b.level, (this.#nowMs - b.updatedMs) / 1000, capacity, refillPerSec);
  }

  windowAdd(key: string, windowMs: bigint, amount: bigint): bigint {
    checkKey(key);
    const now = this.#nowMs;
    const span = Math.max(0, Number(windowMs));
    let w = this.#windows.get(key);
    if (w === undefined) {
      w = { events: [], total: 0 };
      this.#windows.set(key, w);
    }
    while (w.events.length > 0 && now - w.events[0]![0] >= span) {
      w.total -= w.events.shift()![1];
    }
    if (amount !== 0n) {
      w.events.push([now, Number(amount)]);
      w.total += Number(amount);
    }
    return BigInt(w.total);
  }

  quotaTake(key: string, period: string, limit: number, amount: number): number {
    const inForce = this.quotaLimit(key, period, limit);
    const { bucket, end } = this.#quotaWindow(key, period, 0);
    if (this.bucketTake(bucket, inForce, 0, amount) === 0) return 0;
    if (amount > inForce) return Infinity;
    return Math.max((end - this.nowUnixMs()) / 1000, 0.001);
  }

  quotaRefund(key: string, period: string, limit: number, amount: number, atUnixMs: bigint): number {
    const inForce = this.quotaLimit(key, period, limit);
    const { bucket, end } = this.#quotaWindow(key, period, Number(atUnixMs));
    // Once that window is over, nothing changes.
    if (end <= this.nowUnixMs()) return this.bucketLevel(bucket, inForce, 0);
    return this.bucketRefund(bucket, inForce, 0, amount);
  }

  quotaLevel(key: string, period: string, limit: number): number {
    const inForce = this.quotaLimit(key, period, limit);
    const { bucket } = this.#quotaWindow(key, period, 0);
    return this.bucketLevel(bucket, inForce, 0);
  }

  quotaLimit(key: string, period: string, limit: number): number {
    checkKey(key);
    checkKey(period);
    return this.#quotaLimits.get(`${key}\u0000${period}`) ?? limit;
  }

  quotaResetMs(period: string): bigint {
    return BigInt(this.#quotaWindow('', period, 0).end);
  }

  event(name: string): void {
    if (!/^[a-z0-9_]{1,64}$/.test(name)) {
      throw new Trap(`event name \`${name}\`: use [a-z0-9_], at most 64 bytes`);
    }
    this.#events.push(name);
  }

  // --- Inside -------------------------------------------------------------------------------

  /** The bucket `key`, created full and refilled up to now. */
  #bucket(key: string, capacity: number, refillPerSec: number): Bucket {
    checkKey(key);
    const now = this.#nowMs;
    let b = this.#buckets.get(key);
    if (b === undefined) {
      b = { level: capacity, updatedMs: now, capacity };
      this.#buckets.set(key, b);
    }
    b.capacity = capacity;
    b.level = refilled(b.level, (now - b.updatedMs) / 1000, capacity, refillPerSec);
    b.updatedMs = now;
    return b;
  }

  /**
   * The bucket of the window of `period` holding `atUnixMs` (now when 0), and the window's end. A
   * bad period is the WIT error the real host returns.
   */
  #quotaWindow(key: string, period: string, atUnixMs: number): { bucket: string; end: number } {
    checkKey(key);
    checkKey(period);
    const at = atUnixMs === 0 ? this.nowUnixMs() : atUnixMs;
    let p: Period;
    let start: number;
    let end: number;
    try {
      p = parsePeriod(period);
      [start, end] = periodWindow(p, at);
    } catch (e) {
      throw new ComponentError(typeof e === 'string' ? e : String(e));
    }
    // The host's naming: control characters keep it apart from any key a policy chooses.
    const name = p.zone === undefined ? p.span : `${p.span}@${p.zone}`;
    return { bucket: `\u0001quota\u0001${name}\u0001${start}\u0001${key}`, end };
  }
}

/** The one fake host the WIT imports resolve to under Node. */
export const fakeHost = new FakeHost();

function refilled(level: number, elapsedSeconds: number, capacity: number, refill: number): number {
  return Math.min(level + elapsedSeconds * Math.max(refill, 0), capacity);
}

function checkKey(key: string): void {
  const bytes = Buffer.byteLength(key, 'utf8');
  if (bytes > MAX_KEY_BYTES) {
    throw new Trap(`a state key of ${bytes} bytes: the host takes at most ${MAX_KEY_BYTES}`);
  }
}

function cutBytes(s: string, max: number): string {
  const bytes = Buffer.from(s, 'utf8');
  if (bytes.length <= max) return s;
  // Decoding a cut in the middle of a character would leave U+FFFD; drop the partial character.
  return bytes.subarray(0, max).toString('utf8').replace(/\uFFFD$/, '');
}
