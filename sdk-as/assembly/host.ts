// Host functions (ABI v1 imports, module `slotgate`): log, a monotonic clock, token buckets and
// sliding-window counters. Their state lives in the host, so it outlives the per-call instance;
// keys are the policy's own (the host keeps each policy's apart). The declarations match the host's
// linker in sidecar/src/policy/module.rs type for type; the runner checks them (runner/wasm.mjs).

/** Longest key or log message the host accepts, in UTF-8 bytes. */
export const MAX_HOST_STRING: i32 = 4096;

/** Severity of a `log` message. */
export enum Level {
  Error = 0,
  Warn = 1,
  Info = 2,
  Debug = 3,
}

// @ts-ignore: decorator
@external("slotgate", "log")
declare function host_log(level: i32, ptr: i32, len: i32): void;
// @ts-ignore: decorator
@external("slotgate", "now_ms")
declare function host_now_ms(): i64;
// @ts-ignore: decorator
@external("slotgate", "bucket_take")
declare function host_bucket_take(keyPtr: i32, keyLen: i32, capacity: f64, refillPerSec: f64, amount: f64): f64;
// @ts-ignore: decorator
@external("slotgate", "bucket_refund")
declare function host_bucket_refund(keyPtr: i32, keyLen: i32, capacity: f64, refillPerSec: f64, amount: f64): f64;
// @ts-ignore: decorator
@external("slotgate", "window_add")
declare function host_window_add(keyPtr: i32, keyLen: i32, windowMs: i64, amount: i64): i64;

/** Logs `msg` through the host's logger, tagged with the policy's name; cut to 4096 bytes. */
export function log(level: Level, msg: string): void {
  const buf = String.UTF8.encode(msg);
  let len = buf.byteLength;
  if (len > MAX_HOST_STRING) {
    len = MAX_HOST_STRING;
    // Back to the start of a character: continuation bytes are 0b10xxxxxx.
    const p = changetype<usize>(buf);
    while (len > 0 && (load<u8>(p + <usize>len) & 0xc0) == 0x80) len--;
  }
  host_log(<i32>level, <i32>changetype<usize>(buf), len);
}

/**
 * Monotonic milliseconds since an arbitrary start (the host's, not the Unix epoch: wall-clock time
 * is `EvaluateInput.nowUnixMs`).
 */
export function nowMs(): i64 {
  return host_now_ms();
}

/**
 * Takes `amount` from the token bucket `key` (created full, refilled at `refillPerSec` up to
 * `capacity`). Returns 0 when taken; otherwise takes nothing and returns the seconds until `amount`
 * will be available, `Infinity` when it never will be (`amount > capacity`, or no refill).
 */
export function bucketTake(key: string, capacity: f64, refillPerSec: f64, amount: f64): f64 {
  const k = hostKey(key);
  return host_bucket_take(<i32>changetype<usize>(k), k.byteLength, capacity, refillPerSec, amount);
}

/**
 * Gives `amount` back to the bucket `key`, up to its `capacity`; a negative amount charges more and
 * may take the level below zero. Returns the new level.
 */
export function bucketRefund(key: string, capacity: f64, refillPerSec: f64, amount: f64): f64 {
  const k = hostKey(key);
  return host_bucket_refund(<i32>changetype<usize>(k), k.byteLength, capacity, refillPerSec, amount);
}

/**
 * Adds `amount` to the sliding-window counter `key` now and returns its total over the last
 * `windowMs` milliseconds. `amount` 0 only reads.
 */
export function windowAdd(key: string, windowMs: i64, amount: i64): i64 {
  const k = hostKey(key);
  return host_window_add(<i32>changetype<usize>(k), k.byteLength, windowMs, amount);
}

/** The key's UTF-8 bytes; the host traps on an oversized key, so fail first, with a message. */
function hostKey(key: string): ArrayBuffer {
  const k = String.UTF8.encode(key);
  if (k.byteLength > MAX_HOST_STRING) {
    abort(
      "host state key of " + k.byteLength.toString() + " bytes is over the " + MAX_HOST_STRING.toString() + "-byte limit",
    );
  }
  return k;
}
