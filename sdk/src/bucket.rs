//! The token-bucket arithmetic behind `bucket_take` / `bucket_refund`: one definition, used by the
//! sidecar's host functions and by the SDK's native emulation, so a policy's unit tests see exactly
//! what it will see in slotgate.

/// The level of a bucket at `level` after `elapsed_seconds` of refilling at `refill` per second,
/// never above `capacity`.
pub fn refilled(level: f64, elapsed_seconds: f64, capacity: f64, refill: f64) -> f64 {
    (level + elapsed_seconds * refill.max(0.0)).min(capacity)
}

/// Takes `amount` from a bucket at `level`: `(new level, 0.0)`, or, when it cannot, the level
/// unchanged and the seconds until `amount` will be there (infinity if never: no refill, or more than
/// `capacity`).
pub fn take(level: f64, capacity: f64, refill: f64, amount: f64) -> (f64, f64) {
    if level >= amount {
        return (level - amount, 0.0);
    }
    if refill <= 0.0 || amount > capacity {
        return (level, f64::INFINITY);
    }
    (level, (amount - level) / refill)
}

/// Gives `amount` back to a bucket at `level` (a negative amount charges more and may leave a debt),
/// never above `capacity`.
pub fn refund(level: f64, capacity: f64, amount: f64) -> f64 {
    (level + amount).min(capacity)
}
