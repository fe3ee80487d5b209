// The runner's stand-in for slotgate's host state (sidecar/src/policy/state.rs), ported from the
// Rust SDK's emulation (sdk/src/host/emulated.rs and sdk/src/bucket.rs): the same token-bucket and
// sliding-window arithmetic, on a manual clock, and the log kept for tests to read.

/** Longest key or log message the host accepts, in UTF-8 bytes; a longer one traps. */
export const MAX_HOST_STRING = 4096;

/** The `slotgate` imports, with the types slotgate's linker gives them (module.rs). */
export const HOST_FUNCTIONS = {
  log: { params: ["i32", "i32", "i32"], results: [] },
  now_ms: { params: [], results: ["i64"] },
  bucket_take: { params: ["i32", "i32", "f64", "f64", "f64"], results: ["f64"] },
  bucket_refund: { params: ["i32", "i32", "f64", "f64", "f64"], results: ["f64"] },
  window_add: { params: ["i32", "i32", "i64", "i64"], results: ["i64"] },
};

export const LEVELS = ["error", "warn", "info", "debug"];

/** A host error that ends the call, as slotgate's `host_str` does (the call fails: `kind` `abi`). */
export class HostError extends Error {}

export class EmulatedHost {
  constructor() {
    this.reset();
    /** Print each log line to stderr as it comes (`{ echo: true }` on the runner). */
    this.echo = false;
  }

  /** Forgets all state: buckets, windows, log; the clock goes to 0. */
  reset() {
    this.nowMs = 0;
    this.buckets = new Map();
    this.windows = new Map();
    this.logs = [];
  }

  advanceMs(ms) {
    this.nowMs += Math.max(0, ms);
  }

  /** The log lines since the last call, as `{level, message}`. */
  takeLogs() {
    const out = this.logs;
    this.logs = [];
    return out;
  }

  /** The bucket `key`, created full and refilled up to now. */
  bucket(key, capacity, refill) {
    let b = this.buckets.get(key);
    if (!b) {
      b = { level: capacity, updatedMs: this.nowMs };
      this.buckets.set(key, b);
    }
    const dt = (this.nowMs - b.updatedMs) / 1000;
    b.level = Math.min(b.level + dt * Math.max(refill, 0), capacity);
    b.updatedMs = this.nowMs;
    return b;
  }

  bucketTake(key, capacity, refill, amount) {
    const b = this.bucket(key, capacity, refill);
    if (b.level >= amount) {
      b.level -= amount;
      return 0;
    }
    if (refill <= 0 || amount > capacity) return Infinity;
    return (amount - b.level) / refill;
  }

  bucketRefund(key, capacity, refill, amount) {
    const b = this.bucket(key, capacity, refill);
    b.level = Math.min(b.level + amount, capacity);
    return b.level;
  }

  windowAdd(key, windowMs, amount) {
    let w = this.windows.get(key);
    if (!w) {
      w = { events: [], total: 0n };
      this.windows.set(key, w);
    }
    const now = BigInt(this.nowMs);
    const span = windowMs > 0n ? windowMs : 0n;
    while (w.events.length > 0 && !(now - w.events[0].at < span)) {
      w.total -= w.events.shift().n;
    }
    if (amount !== 0n) {
      w.events.push({ at: now, n: amount });
      w.total += amount;
    }
    return BigInt.asIntN(64, w.total);
  }

  log(level, message) {
    const name = LEVELS[level] ?? "debug";
    if (this.echo) process.stderr.write(`[policy ${name}] ${message}\n`);
    this.logs.push({ level: name, message });
  }

  /** The `slotgate` import object for an instance whose memory `memory()` returns. */
  imports(memory) {
    const str = (ptr, len) => {
      if (len < 0 || len > MAX_HOST_STRING) {
        throw new HostError(`host string of ${len} bytes (limit ${MAX_HOST_STRING})`);
      }
      const buf = memory().buffer;
      const start = ptr >>> 0;
      if (start + len > buf.byteLength) throw new HostError(`pointer ${start}+${len} is outside the guest's memory`);
      try {
        return new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(buf, start, len));
      } catch {
        throw new HostError("host string is not UTF-8");
      }
    };
    return {
      slotgate: {
        log: (level, ptr, len) => this.log(level, str(ptr, len)),
        now_ms: () => BigInt(this.nowMs),
        bucket_take: (kp, kl, capacity, refill, amount) => this.bucketTake(str(kp, kl), capacity, refill, amount),
        bucket_refund: (kp, kl, capacity, refill, amount) => this.bucketRefund(str(kp, kl), capacity, refill, amount),
        window_add: (kp, kl, windowMs, amount) => this.windowAdd(str(kp, kl), windowMs, amount),
      },
    };
  }
}
