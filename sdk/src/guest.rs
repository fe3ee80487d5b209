//! The wasm32 guest glue behind [`export_policy!`](crate::export_policy): the only code that turns
//! the host's pointers into slices and back. Compiled on wasm32 only.
//!
//! Memory is never freed. The host instantiates a fresh module for every call and drops it after
//! copying the output, so a leaked buffer lives exactly as long as it must and no longer; a real
//! free would only spend fuel.

use std::cell::UnsafeCell;

use crate::dispatch;
use crate::host::{self, Level};
use crate::policy::Policy;

/// `slotgate_alloc`: `len` writable bytes for the host's input, or 0 for a negative length.
pub fn alloc(len: i32) -> i32 {
    let Ok(len) = usize::try_from(len) else {
        return 0;
    };
    // At least one byte, so the pointer is a real allocation and never 0, even for `len == 0`.
    let mut buf = Vec::<u8>::with_capacity(len.max(1));
    let ptr = buf.as_mut_ptr();
    std::mem::forget(buf);
    ptr as usize as i32
}

/// The input the host wrote at `ptr..ptr + len`.
///
/// # Safety
///
/// `ptr` must come from [`alloc`] with at least `len` bytes, all written by the host, and nothing
/// may write them while the slice lives. The host's calling convention guarantees both.
#[allow(
    unsafe_code,
    reason = "the policy ABI passes guest memory as raw pointers"
)]
pub unsafe fn input<'a>(ptr: i32, len: i32) -> &'a [u8] {
    // SAFETY: upheld by the caller, as documented above; the buffer is leaked, so it outlives 'a.
    unsafe { std::slice::from_raw_parts(ptr as u32 as usize as *const u8, len as u32 as usize) }
}

/// The settings `slotgate_validate_settings` parsed, kept in the instance's memory. The host
/// snapshots that instance, so every later instance starts with them (see
/// [`dispatch::validate_settings`]); an instance the host did not start from a snapshot has none and
/// parses the settings in its input.
pub struct Kept<T>(UnsafeCell<Option<T>>);

// SAFETY: wasm32 policies are single-threaded (no wasm threads), and `Kept` is only reached from the
// export functions, which never run re-entrantly.
#[allow(
    unsafe_code,
    reason = "the policy ABI passes guest memory as raw pointers"
)]
unsafe impl<T> Sync for Kept<T> {}

impl<T> Kept<T> {
    pub const fn new() -> Self {
        Kept(UnsafeCell::new(None))
    }

    fn get(&self) -> Option<&T> {
        // SAFETY: single-threaded, and `set` runs only in `slotgate_validate_settings`, while no
        // reference from `get` is alive.
        #[allow(
            unsafe_code,
            reason = "the policy ABI passes guest memory as raw pointers"
        )]
        unsafe {
            (*self.0.get()).as_ref()
        }
    }

    fn set(&self, value: Option<T>) {
        // SAFETY: as for `get`.
        #[allow(
            unsafe_code,
            reason = "the policy ABI passes guest memory as raw pointers"
        )]
        unsafe {
            *self.0.get() = value;
        }
    }
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept::new()
    }
}

/// `slotgate_evaluate`'s answer: the decision, or 0 after logging why there is none.
pub fn evaluate<P: Policy>(input: &[u8], kept: &Kept<P::Settings>) -> i64 {
    match dispatch::evaluate::<P>(input, kept.get()) {
        Ok(out) => pack(out),
        Err(e) => {
            report("slotgate_evaluate", &e);
            0
        }
    }
}

/// `slotgate_validate_settings`'s answer; valid settings are kept in `kept`.
pub fn validate_settings<P: Policy>(input: &[u8], kept: &Kept<P::Settings>) -> i64 {
    let (answer, settings) = dispatch::validate_settings::<P>(input, true);
    kept.set(settings);
    pack(answer)
}

/// `slotgate_on_complete`'s answer: always 0 (no output).
pub fn on_complete<P: Policy>(input: &[u8], kept: &Kept<P::Settings>) -> i64 {
    if let Err(e) = dispatch::on_complete::<P>(input, kept.get()) {
        report("slotgate_on_complete", &e);
    }
    0
}

/// Leaks `out` (see the module comment) and packs it as `(ptr << 32) | len`.
fn pack(out: Vec<u8>) -> i64 {
    let out: &'static mut [u8] = Box::leak(out.into_boxed_slice());
    let (ptr, len) = (out.as_ptr() as usize as u64, out.len() as u64);
    ((ptr << 32) | len) as i64
}

/// Logs why a call has no answer; the host only sees the 0.
fn report(call: &str, error: &str) {
    host::log(Level::Error, &format!("{call}: {error}"));
}

/// `name` as the fixed array the `slotgate.policy` custom section holds.
pub const fn name_bytes<const N: usize>(name: &str) -> [u8; N] {
    let (mut out, bytes, mut i) = ([0u8; N], name.as_bytes(), 0);
    while i < N {
        out[i] = bytes[i];
        i += 1;
    }
    out
}
